"""Routing decisions from router logs: stored on their own, joined to any trace when read
(Lab, warm-up, check, collect), folded into one view, and laid out as the Routing table."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

from mmlens.analysis.decisions import merged
from mmlens.analysis.routing_table import (
    candidate_rows,
    candidates_text,
    decision_rows,
    gate_rows,
    gates_text,
    score_rows,
    scores_text,
)
from mmlens.ingest.router_logs import cache_trace_decision, parse_lines
from mmlens.records import (
    RequestTrace,
    RoutingCandidate,
    RoutingDecision,
    RoutingScore,
    SpillGate,
)
from mmlens.store.decisions import attach
from mmlens.store.open import open_store
from mmlens.store.reader import StoreReader
from mmlens.store.snapshot import build_snapshot
from mmlens.store.sqlite import Store
from tests.fixtures_path import capture
from tests.verdicts_support import judged

W1, W2 = "grpc://127.0.0.1:24410", "grpc://127.0.0.1:24420"
FIRST, HIT = "mmlens-04299d8794744c2f", "mmlens-c7ec9e9b9adf4761"
HIT_RESPONSE = HIT + "-01a22b15-eef0-720f-9935-83b63d340f40"


def _logged() -> list[RoutingDecision]:
    return parse_lines(capture("smg_1.13_cache_trace_log.jsonl").splitlines())


def _header(rid: str) -> RoutingDecision:
    return cache_trace_decision({"root_id": rid, "selections": [{
        "policy": "cache_aware", "origin": "policy", "worker": W2,
        "prediction": {"source": "event_index_overlap", "branch": "event_hit",
                       "overlap_blocks": 5, "request_blocks": 5, "block_size": 16}}]})


def _lab_trace(rid: str, response_id: str | None, ts: float) -> RequestTrace:
    """A trace as the Lab writes it: straight to the store, header decision only."""
    return RequestTrace(rid, "http://r", "smg", "m", ts, False, worker=W2, prompt_tokens=81,
                        cached_tokens=80, response_id=response_id, predictions=[_header(rid)])


def test_store_round_trip_and_reader_join_by_response_id(store_db: str) -> None:
    db = store_db
    store = open_store(db)
    assert store.add_decisions(_logged(), ts=5.0) == 2
    # A decision logged under the engine id: the reader still finds it for the request.
    store.add_decisions([RoutingDecision(HIT_RESPONSE, "smg", "log:other", ts=6.0,
                                         warnings=["w"])])
    store.add_traces([_lab_trace(HIT, HIT_RESPONSE, 10.0), _lab_trace("other", None, 11.0)])
    store.close()
    reader = StoreReader(db)
    try:
        assert [d.source for d in reader.decisions_for(HIT)] == ["log:cache_trace"]
        assert len(reader.decisions_for(HIT, HIT_RESPONSE)) == 2
        trace = reader.trace(HIT)
        assert trace is not None
        assert [p.source for p in trace.predictions] == [
            "header:x-smg-cache-trace", "log:cache_trace", "log:other"]
        assert [c.worker for c in trace.predictions[1].candidates] == [W1, W2]
        recent = {t.request_id: t for t in reader.recent_traces(10)}
        assert len(recent[HIT].predictions) == 3 and len(recent["other"].predictions) == 1
        snap = build_snapshot(reader, count_kv_events=False)
        assert snap.traces[1].predictions[1].gates[0].spill is False
        assert snap.to_json()["traces"][1]["predictions"][1]["gates"][0]["spill"] is False
    finally:
        reader.close()


def test_store_prunes_decisions_with_the_rest(store_db: str) -> None:
    store = open_store(store_db)
    store.add_decisions([RoutingDecision("old", "smg", "log:x", ts=1.0),
                         RoutingDecision("new", "smg", "log:x")], ts=1000.0)
    assert store.prune(retention_s=10, max_bytes=1e12, now=1005.0) == 1
    assert [d.request_id for d in store.decisions(["old", "new"])] == ["new"]
    store.close()


def test_reader_on_a_store_from_before_the_decisions_table(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    Store(db).close()
    raw = sqlite3.connect(db)
    raw.execute("DROP TABLE decisions")
    raw.commit()
    raw.close()
    reader = StoreReader(db)  # read-only: cannot add the table, reads it as empty
    try:
        assert reader.decisions_for("r") == [] and reader.recent_traces() == []
    finally:
        reader.close()
    writer = Store(db)  # a collector opening it adds the table, same schema version
    assert writer.add_decisions([RoutingDecision("r", "smg", "log:x")]) == 1
    writer.close()


def test_attach_skips_decisions_an_old_row_already_holds() -> None:
    logged = _logged()
    trace = _lab_trace(HIT, None, 1.0)
    # Rows written while the collector still joined decisions in memory carry them.
    trace.predictions.append(replace(logged[1]))
    assert attach([trace], logged) == 0
    lab = _lab_trace(HIT, None, 1.0)
    assert attach([lab], logged) == 1 and attach([lab], logged) == 0
    timing = RoutingDecision(HIT, "smg", "log:mm_timing", expanded_tokens=81)
    assert attach([lab], [timing]) == 1 and lab.processing_mode == "router"


def test_merged_view_prefers_block_counts_and_keeps_every_detail() -> None:
    header, (_, logged) = _header(HIT), _logged()
    dynamo = [RoutingDecision("r", "dynamo", "log:cost_formula",
                              candidates=[RoutingCandidate("7")],
                              scores=[RoutingScore("cost", "7", 6.0)]),
              RoutingDecision("r", "dynamo", "log:cost_formula",
                              candidates=[RoutingCandidate("9", load=None)],
                              scores=[RoutingScore("cost", "9", 8.5)]),
              RoutingDecision("r", "dynamo", "log:routing_best", worker="7", overlap_blocks=5,
                              request_blocks=6)]
    view = merged([header, logged])
    assert (view.worker, view.branch, view.policy, view.origin) == (
        W2, "event_hit", "cache_aware", "policy")
    assert len(view.candidates) == 2 and len(view.gates) == 1
    assert view.sources == ["header:x-smg-cache-trace", "log:cache_trace"]
    dyn = merged(dynamo)
    assert (dyn.worker, dyn.overlap_blocks) == ("7", 5)
    assert [c.worker for c in dyn.candidates] == ["7", "9"]
    assert [s.value for s in dyn.scores] == [6.0, 8.5]


def test_merged_candidates_keep_earlier_detail_later_values_win() -> None:
    view = merged([
        RoutingDecision("r", "smg", "a", candidates=[RoutingCandidate("w", 2.0, True)]),
        RoutingDecision("r", "smg", "b", candidates=[RoutingCandidate("w", None, None, True)]),
        RoutingDecision("r", "smg", "c", candidates=[RoutingCandidate("w", 5.0)])])
    assert view.candidates == [RoutingCandidate("w", 5.0, True, True)]


def test_decision_rows_show_candidates_scores_and_gates() -> None:
    first, hit = _logged()
    traces = [
        RequestTrace(HIT, "r", "smg", "m", 2.0, False, worker=W2, prompt_tokens=81,
                     cached_tokens=80, predictions=[_header(HIT), hit]),
        RequestTrace(FIRST, "r", "smg", "m", 1.0, False, predictions=[first]),
        RequestTrace("bare", "r", "smg", "m", 0.5, False),
    ]
    hit_row, first_row, bare = decision_rows(traces, judged(traces))
    assert (hit_row["worker"], hit_row["branch"], hit_row["overlap"]) == (
        W2.split("://")[1], "event_hit", "5/5")
    assert hit_row["verdict"] == "hit"
    assert hit_row["why"] == f"hit: 5 blocks served from cache on {W2} (router predicted 5)"
    assert hit_row["policy"] == "cache_aware / policy / event_index_overlap"
    assert hit_row["candidates"] == "127.0.0.1:24410 load 0 · 127.0.0.1:24420 load 0"
    assert hit_row["scores"] == ("affinity 127.0.0.1:24420: 5 blocks · "
                                 "wait 127.0.0.1:24420: 0 s")
    assert hit_row["gates"] == "127.0.0.1:24420: load 0 vs avg 0 ×1.5 / +64 → stay"
    assert hit_row["predicted"] == 80
    # First sight: SMG's approximate tree counts units, not blocks; no gate.
    assert (first_row["worker"], first_row["branch"], first_row["overlap"]) == (
        W2.split("://")[1], "expected_wait_fallback", "0/81 units")
    assert first_row["scores"].count("wait ") == 2 and first_row["gates"] == "—"
    assert (bare["candidates"], bare["scores"], bare["gates"], bare["policy"]) == (
        "—", "—", "—", "—")


def test_text_flags_unhealthy_overloaded_and_spills() -> None:
    assert candidates_text([RoutingCandidate(W1, 70, healthy=False),
                            RoutingCandidate(W2, 3.5, overloaded=True)]) == (
        "127.0.0.1:24410 load 70 (unhealthy) · 127.0.0.1:24420 load 3.5 (overloaded)")
    assert gates_text([SpillGate(W1, 200.0, 20.0, 1.5, 64, spill=True)]).endswith("→ spill")
    assert scores_text([RoutingScore("cost", "7", 6.0, "cost", 5.0)]) == (
        "cost 7: 6 (device 5 blocks)")


def test_detail_rows_put_each_candidate_beside_its_scores_and_gate() -> None:
    _, hit = _logged()
    view = merged([hit])
    rows = {r["worker"]: r for r in candidate_rows(view)}
    assert rows["127.0.0.1:24420"]["chosen"] and not rows["127.0.0.1:24410"]["chosen"]
    assert rows["127.0.0.1:24420"]["gate"].endswith("→ stay")
    assert rows["127.0.0.1:24410"]["scores"] == "—"
    assert [r["source"] for r in score_rows(view)] == ["policy_affinity", "expected_wait"]
    assert "drain_rate=400.0" in score_rows(view)[1]["details"]
    assert gate_rows(view)[0]["absolute margin"] == 4.0
