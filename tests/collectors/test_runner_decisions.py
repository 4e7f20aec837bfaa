"""The collector's log follower stores every routing decision it parses, so a trace written
straight to the store (Lab, warm-up, `mmlens check --db`) meets its candidates, scores and
gates when read — also when the log arrives after the trace."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from mmlens.collectors.runner import CollectorRunner

from mmlens.config import Config, RouterTarget
from mmlens.records import RequestTrace, RoutingDecision
from mmlens.store.reader import StoreReader
from mmlens.store.snapshot import build_snapshot
from mmlens.store.sqlite import Store
from tests.fixtures_path import capture

HIT = "mmlens-c7ec9e9b9adf4761"


def test_followed_log_decisions_reach_traces_written_elsewhere(tmp_path: Path) -> None:
    log, db = tmp_path / "smg.log", tmp_path / "mmlens.db"
    log.write_text("")
    cfg = Config(routers=[RouterTarget("smg", "smg", "http://127.0.0.1:9", log_file=str(log),
                                       discover_workers=False)])
    store = Store(db)
    # The Lab writes its trace first, with the compact header decision only.
    lab = Store(db)
    lab.add_traces([RequestTrace(HIT, "http://127.0.0.1:9", "smg", "m", 1.0, False,
                                 response_id=HIT + "-01a22b15-eef0-720f-9935-83b63d340f40",
                                 predictions=[RoutingDecision(HIT, "smg",
                                                              "header:x-smg-cache-trace")])])
    lab.close()
    runner = CollectorRunner(cfg, store, http=httpx.Client(transport=httpx.MockTransport(
        lambda request: httpx.Response(503))))
    try:
        runner.setup()
        log.write_text(capture("smg_1.13_cache_trace_log.jsonl"))
        runner.flush()
        health = next(h for h in runner.all_health() if h.collector == "router_logs")
        assert health.counters["decisions"] == 2
    finally:
        runner.close()
        store.close()
    reader = StoreReader(db)
    try:
        assert len(reader.decisions_for(HIT)) == 1
        trace = reader.trace(HIT)
        assert trace is not None
        logged = next(p for p in trace.predictions if p.source == "log:cache_trace")
        assert [c.worker for c in logged.candidates] == [
            "grpc://127.0.0.1:24410", "grpc://127.0.0.1:24420"]
        assert logged.gates[0].spill is False
        assert {s.source for s in logged.scores} == {"policy_affinity", "expected_wait"}
        # `mmlens snapshot` joins them the same way
        traces = {t["request_id"]: t for t in build_snapshot(reader).to_json()["traces"]}
        snap_trace = traces[HIT]
        assert [p["source"] for p in snap_trace["predictions"]] == [
            "header:x-smg-cache-trace", "log:cache_trace"]
        assert snap_trace["origin"] == "mmlens"
        # The log's other request, which mmlens did not send, is an observed request.
        (other,) = (t for rid, t in traces.items() if rid != HIT)
        assert other["origin"] == "observed" and other["sources"] == ["router_log"]
    finally:
        reader.close()


def test_decisions_are_joined_when_read_never_when_written(tmp_path: Path) -> None:
    """The collector keeps no decisions in memory: a trace recorded after its log lines were
    read is stored as sent, and meets them in the reader (the one join)."""
    log, db = tmp_path / "smg.log", tmp_path / "mmlens.db"
    log.write_text(capture("smg_1.13_cache_trace_log.jsonl"))
    cfg = Config(routers=[RouterTarget("smg", "smg", "http://127.0.0.1:9", log_file=str(log),
                                       discover_workers=False)])
    store = Store(db)
    runner = CollectorRunner(cfg, store, http=httpx.Client(transport=httpx.MockTransport(
        lambda request: httpx.Response(503))))
    try:
        runner.setup()
        runner.flush()  # the log's decisions are stored
        runner.record_traces([RequestTrace(HIT, "http://127.0.0.1:9", "smg", "m", 2.0, False,
                                           predictions=[RoutingDecision(
                                               HIT, "smg", "header:x-smg-cache-trace")])])
        (body,) = [b for (rid, b) in store.db.execute("SELECT request_id, body FROM traces")
                   if rid == HIT]
    finally:
        runner.close()
        store.close()
    assert [p["source"] for p in json.loads(body)["predictions"]] == ["header:x-smg-cache-trace"]
    reader = StoreReader(db)
    try:
        trace = reader.trace(HIT)
        assert trace is not None
        assert [p.source for p in trace.predictions] == ["header:x-smg-cache-trace",
                                                          "log:cache_trace"]
    finally:
        reader.close()
