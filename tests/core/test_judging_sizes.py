"""Image sizes learned while judging: one worker's requests teach an image's size (SMG logs
sizes, the KV events identities), which settles same-length requests of other sizes on
another worker judged in the same pass."""

from __future__ import annotations

from mmlens.analysis.judgement import batch
from mmlens.analysis.judgement.batch import JudgeState
from mmlens.ingest.observed import fragment
from mmlens.records import ImageInfo, RequestTrace, RoutingDecision

A_ID, B_ID = "a" * 16 + "0" * 48, "b" * 16 + "0" * 48


def _logged(rid: str, worker: str, start: float, size: tuple[int, int]) -> RequestTrace:
    """An SMG request of one image and 7 full blocks, as its log tells it."""
    t = fragment(rid, "router_log", start, "smg", "r")
    t.worker, t.latency_s, t.status = worker, 1.0, 200
    t.images = [ImageInfo("data", width=size[0], height=size[1])]
    t.provenance.update(worker="router_log:smg", latency_s="router_log:smg")
    d = RoutingDecision(rid, "smg", "log:cache_trace", worker=worker, branch="event_hit",
                        overlap_blocks=6, request_blocks=7, block_size=16,
                        expanded_tokens=7 * 16 + 3)
    d.ts = start
    t.predictions = [d]
    return t


def _judged(rounds: int) -> dict[str, tuple[str, int | None]]:
    """On w1, image B's chain stored before; then b (384×256) and c (320×320) at once, and
    a chain of image A off the root and a block off B's chain stored while they ran. On w2,
    "teach" (320×320) alone stored image A's chain: A is 320×320, so b cannot own A's
    chain."""
    state = JudgeState(horizon_s=1e9)
    state.apply_kv([
        (0.5, "w1", "stored", None, [f"b{i}" for i in range(1, 8)], [B_ID]),
        (5.1, "w1", "stored", None, [f"x{i}" for i in range(1, 8)], [A_ID]),
        (5.2, "w1", "stored", "b6", ["y7"]),
        (1.2, "w2", "stored", None, [f"a{i}" for i in range(1, 8)], [A_ID]),
        (30.0, "w1", "stored", None, ["tail1"]), (30.0, "w2", "stored", None, ["tail2"])])
    traces = [_logged("b", "w1", 5.0, (384, 256)), _logged("c", "w1", 5.05, (320, 320)),
              _logged("teach", "w2", 1.0, (320, 320))]
    was = batch.SIZE_ROUNDS
    batch.SIZE_ROUNDS = rounds
    try:
        got = state.judge(traces, [t.request_id for t in traces], judged_at=0.0)
    finally:
        batch.SIZE_ROUNDS = was
    return {v.request_id: (v.category, v.realized_blocks) for v in got}


def test_a_size_another_worker_teaches_settles_requests_judged_with_it():
    once = _judged(1)
    assert once["b"][0].startswith("hit_or_") and once["c"][0].startswith("hit_or_")
    got = _judged(batch.SIZE_ROUNDS)
    assert got["b"] == ("hit", 6) and got["c"][1] == 0 and got["teach"][1] == 0
