"""The What if page on a recorded store: the scenarios side by side with the recording and
the baseline (its error beside each figure), the per-minute chart, a bad scenario said."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pages.apptest_util import assert_clean, figure_titled, messages, open_page, trace_names


@pytest.fixture
def page_db(db: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MMLENS_DB", str(db))
    monkeypatch.delenv("MMLENS_CONFIG", raising=False)
    return db


def test_the_page_shows_scenarios_beside_the_recording(page_db: Path) -> None:
    at = open_page("whatif")
    assert_clean(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Recorded hit rate"] == "62.0%"
    assert metrics["Baseline model error"] == "+0.0 pt"
    table = at.dataframe[0].value
    assert list(table.columns)[:3] == ["figure", "recorded", "baseline"]
    assert len(table.columns) == 3 + 3  # the three default scenarios
    hit = table[table["figure"] == "hit rate (tokens)"].iloc[0]
    assert hit["baseline"] == "62.0% ±0.0pt"
    assert "verdict false_hit" in set(table["figure"])
    fig = figure_titled(at, "hit rate per minute")
    assert trace_names(fig)[:2] == ["recorded", "baseline (recorded)"]
    at.multiselect[0].set_value(["SMG round_robin"]).run()
    assert len(at.dataframe[0].value.columns) == 4
    at.text_input[0].set_value("policy=nope").run()
    assert any("unknown policy" in m for m in messages(at)["info"])
