"""One verdict per request, whatever view shows it: on one store (the recorded one, on both
backends, plus the real SMG captures' observed requests, and a request not judged yet) the
stored verdict, `mmlens snapshot --json`, the Routing page's table, `mmlens explain`, the
Inspector, the Cache page's predicted-vs-realized points and the exporter's counts all name
the same category for every request; a request not judged yet is pending in every one."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from mmlens.collectors.metrics_export import StoreExport

from mmlens.analysis.routing_table import decision_rows
from mmlens.cli import explain as explain_cli
from mmlens.cli import snapshot as snapshot_cli
from mmlens.figures.cache import predicted_vs_realized_figure
from mmlens.records import RequestTrace
from mmlens.store.open import open_store
from mmlens.store.reader import StoreReader
from tests.export.metrics_text import by, scrape, series
from tests.observed.test_captures import load
from tests.pages.apptest_util import assert_clean, messages, open_page
from tests.pages.recorded_store import Recorded


def _cli(main, argv: list[str]) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    return json.loads(buf.getvalue())


def _views(db: str) -> dict[str, dict[str, str]]:
    reader = StoreReader(db)
    try:
        traces = reader.recent_traces(10_000)
        stored = reader.verdicts_for(traces)
    finally:
        reader.close()
    ids = [t.request_id for t in traces]
    snap = _cli(snapshot_cli.main, ["--db", db, "--json", "--traces", "10000"])
    views = {
        "stored": {r: stored[r].category if r in stored else "pending" for r in ids},
        "snapshot": {t["request_id"]: (t["verdict"] or {}).get("category") or "pending"
                     for t in snap["traces"]},
        "routing": {r["request"]: r["verdict"] for r in decision_rows(traces, stored, 10_000)},
        "explain": {r: _cli(explain_cli.main, ["--db", db, "--request", r, "--json"])
                    ["category"] or "pending" for r in ids},
    }
    chart = predicted_vs_realized_figure(traces, stored)
    if chart.series:
        views["cache"] = {rid: text.rsplit("\n", 1)[1] for s in chart.series
                          for rid, text in zip(s.ids, s.hovers, strict=True)}
    counts = Counter(views["stored"].values())
    exported = {k: v for k, v in by(series(scrape(StoreExport(db))), "mmlens_requests_total",
                                    "verdict").items() if v}
    assert exported == dict(counts)
    assert snap["observed"]["verdicts"] == {**dict.fromkeys(snap["observed"]["verdicts"], 0),
                                            **counts}
    return views


def _agree(views: dict[str, dict[str, str]]) -> None:
    stored = views["stored"]
    for name, got in views.items():
        assert set(got) <= set(stored), name
        differ = {r: (stored[r], v) for r, v in got.items() if v != stored[r]}
        assert not differ, (name, differ)


def _inspector_category(rid: str) -> str:
    at = open_page("inspector", {"request": rid})
    assert_clean(at)
    shown = messages(at)
    for text in shown["success"] + shown["warning"]:
        found = re.match(r"\*\*(\w+)\*\* — ", text)
        if found:
            return found.group(1)
    assert any(c.value.startswith("pending: ") for c in at.caption), shown
    return "pending"


def test_every_view_shows_the_stored_verdict(db: Recorded) -> None:
    store = open_store(db.path)  # one more request, not judged yet
    late = RequestTrace("req-late", "http://r", "smg", "m", db.now, False, worker="w1",
                        status=200, prompt_tokens=40, latency_s=0.1)
    store.add_traces([late])
    store.close()
    views = _views(db.path)
    _agree(views)
    assert views["stored"]["req-late"] == "pending"
    assert {"hit", "false_hit", "count_drift", "error"} <= set(views["stored"].values())
    for rid in (db.hit_id, db.false_hit_id, "req-late"):
        assert _inspector_category(rid) == views["stored"][rid]


@pytest.mark.parametrize("otlp", [False, True], ids=["logs", "logs+otlp"])
def test_observed_requests_agree_too(tmp_path: Path, otlp: bool) -> None:
    db = str(load(tmp_path, "smg_1.13", with_otlp=otlp))
    views = _views(db)
    _agree(views)
    assert "false_hit" in views["stored"].values() or not otlp
