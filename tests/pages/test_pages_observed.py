"""The pages on requests mmlens did not send: a store filled from the real SMG 1.13 captures
(router log lines and OTLP spans). The Routing page lists them with origin and verdict, the
Inspector says where each field came from and what is unknown, the Overview counts the
false hit over all traffic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmlens.store.reader import StoreReader
from tests.observed.test_captures import load, responses
from tests.pages.apptest_util import assert_clean, drawn_decisions, frames, messages, open_page

PREFIX = "smg_1.13"


@pytest.fixture(params=["logs", "logs+otlp"])
def observed_db(request: pytest.FixtureRequest, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    db = load(tmp_path, PREFIX, with_otlp=request.param != "logs")
    monkeypatch.setenv("MMLENS_DB", str(db))
    monkeypatch.delenv("MMLENS_CONFIG", raising=False)
    return db, request.param


def _root_id(db: Path, response_id: str) -> str:
    reader = StoreReader(db)
    try:
        t = reader.trace(response_id)
        assert t is not None
        return t.request_id
    finally:
        reader.close()


def test_routing_page_lists_observed_requests_with_verdicts(observed_db) -> None:
    db, mode = observed_db
    at = open_page("routing")
    assert_clean(at)
    df = drawn_decisions(at)
    assert len(df) == 5 and set(df["origin"]) == (
        {"router_log"} if mode == "logs" else {"otlp+router_log"})
    blue = _root_id(db, responses(PREFIX)["blue"]["id"])
    row = df[df["request"] == blue].iloc[0]
    if mode == "logs":
        assert (row["verdict"], row["cached"]) == ("unknown", "?")
    else:
        assert (row["verdict"], row["cached"]) == ("false_hit", 0)


def test_inspector_says_where_fields_came_from(observed_db) -> None:
    db, mode = observed_db
    rid = _root_id(db, responses(PREFIX)["blue"]["id"])
    at = open_page("inspector", {"request": rid})
    assert_clean(at)
    table = next(d for d in frames(at) if "source" in d.columns
                 and "field" in d.columns)
    sources = dict(zip(table["field"], table["source"], strict=True))
    assert sources["worker"] == "router_log:smg"
    if mode == "logs":
        assert sources["cached_tokens"] == "unknown"
        assert any("unknown" in m for m in messages(at)["warning"])
    else:
        assert sources["cached_tokens"] == "otlp:llm_request"
        assert any("false_hit" in m for m in messages(at)["warning"])


def test_overview_counts_false_hits_over_observed_traffic(observed_db) -> None:
    _, mode = observed_db
    at = open_page("overview")
    assert_clean(at)
    alerts = [m for m in messages(at)["warning"] if "false_hits" in m]
    if mode == "logs":  # realized hits unknown: no false hit can be claimed
        assert alerts == []
    else:
        (alert,) = alerts
        assert "1 not sent by mmlens" in alert.replace("(", "").replace(")", "")


def test_snapshot_json_lists_observed_requests(observed_db, capsys) -> None:
    from mmlens.cli.main import main

    db, mode = observed_db
    assert main(["snapshot", "--db", str(db), "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["observed"]["by_origin"] == {"observed": 5}
    assert all(t["origin"] == "observed" and "verdict" in t for t in snap["traces"])
    verdicts = snap["observed"]["verdicts"]
    assert verdicts["false_hit"] == (0 if mode == "logs" else 1)
