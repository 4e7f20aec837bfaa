"""Router-side image identity ↔ the engine's identifier, learned from what a worker stored."""

from __future__ import annotations

from mmlens.analysis.identity_map import identity_links, identity_rows
from mmlens.records import ImageInfo, KVEventRow, RequestTrace

W1, W2 = "grpc://127.0.0.1:50051", "grpc://127.0.0.1:50052"


def _trace(rid: str, ts: float, worker: str, identity: str) -> RequestTrace:
    return RequestTrace(request_id=rid, router="r", router_kind="smg", model="m", ts=ts,
                        stream=False, worker=worker, status=200, latency_s=0.1,
                        images=[ImageInfo("data", 10, 320, 240, {"smg_blake3": identity})])


def _stored(ts: float, worker: str, seq: int, images: list[str]) -> KVEventRow:
    return KVEventRow(ts, worker, 0, seq, "stored", 2, None, [seq * 10, seq * 10 + 1], images)


def test_router_mode_and_worker_mode_identifiers_of_one_image() -> None:
    traces = [_trace("router-mode", 100.0, W1, "aa" * 32),
              _trace("worker-mode", 200.0, W2, "aa" * 32),  # the same bytes, worker mode
              _trace("crowded", 300.0, W1, "bb" * 32), _trace("other", 300.02, W1, "cc" * 32)]
    events = [_stored(100.05, W1, 1, ["aa" * 32]),  # SMG's identity, forwarded
              _stored(200.05, W2, 2, ["ff" * 32]),  # the worker's own
              _stored(300.05, W1, 3, ["dd" * 32])]  # two requests in service: no owner
    (link,) = identity_links(events, traces)
    assert link.router_id == "aa" * 32 and link.size == "320x240"
    assert link.engine_ids == {"aa" * 32: {W1}, "ff" * 32: {W2}}
    rows = {r["engine identifier"]: r for r in identity_rows([link], {W1: "w1", W2: "w2"})}
    assert rows["aa" * 8]["engine keyed it by"] == "the router's identity (router mode)"
    assert rows["ff" * 8]["engine keyed it by"].startswith("its own identifier")
    assert rows["ff" * 8]["on workers"] == "w2"


def test_smgs_re_keyed_identity_counts_as_the_routers() -> None:
    from mmlens.layout.expected import ExpectedLayout, LayoutImage

    t = _trace("r", 100.0, W1, "aa" * 32)
    t.expected_layout = ExpectedLayout(images=[LayoutImage(320, 240, 80, identity={
        "smg": "ee" * 32, "content": "aa" * 32})])
    (link,) = identity_links([_stored(100.05, W1, 1, ["ee" * 32])], [t])
    assert link.router_keyed == {"ee" * 32}


def test_the_serving_index_finds_the_owner_every_trace_would() -> None:
    """``Serving.owner`` looks only at requests begun within the longest service before an
    event: the same owner (or none) as asking every trace, on random overlapping services."""
    import random
    from dataclasses import replace

    from mmlens.analysis.block_labels import SLACK_S, Serving, _service

    rng = random.Random(7)
    traces = [replace(_trace(f"r{i}", rng.uniform(0, 100), rng.choice([W1, W2, ""]), "aa"),
                      latency_s=rng.choice([0.0, 0.5, 3.0, 20.0]),
                      error="boom" if rng.random() < 0.1 else None)
              for i in range(300)]
    serving = Serving(traces)
    found = 0
    for j in range(2000):
        ev = _stored(rng.uniform(-5, 130), rng.choice([W1, W2]), j, ["aa"])
        every = [t for t in traces if (s := _service(t)) and t.worker == ev.worker
                 and s[0] <= ev.ts <= s[1]]
        want = every[0] if len(every) == 1 else None
        assert serving.owner(ev) is want, ev
        found += want is not None
    assert found > 50 and SLACK_S > 0  # owners found, not only "none" both ways
