"""Available vs achieved on the Dynamo demo: the real Dynamo 1.6.1 frontend routes images
exactly (per-image pad values), so once its index holds a request's blocks, a repeat goes to
the worker holding them and nothing is avoidable. mmlens reads the workers' own KV events
(image runs in pad-value form, identity in extra_keys as Dynamo's mm_hash)."""

from __future__ import annotations

from pathlib import Path

from mmlens.collectors.traces import solid_png

from tests.dynamo.support import LIVE_DYNAMO, applied_stored, running_dynamo, wait_router_indexed
from tests.live_support import collecting, wait_until

pytestmark = LIVE_DYNAMO

TEXT = "Describe this image in detail please."
RED, BLUE = (200, 30, 30), (30, 30, 200)


def test_exact_routing_leaves_nothing_avoidable(tmp_path: Path) -> None:
    with running_dynamo() as cluster, collecting(cluster.ready_info(),
                                                 tmp_path / "dynamo.db") as c:
        def send(color: tuple[int, int, int]):
            return c.send(solid_png(640, 480, color), TEXT, "dynamo")

        send((9, 9, 9))
        wait_until(c.stored_blocks, 15, what="the warm-up request's KV events stored")
        seeds = []
        for color in (RED, BLUE):
            before = applied_stored(cluster)
            seeds.append(send(color))
            wait_router_indexed(cluster, before)
        repeats = [send(RED), send(BLUE)]

        wanted = {t.request_id for t in seeds + repeats}
        seen: list = []  # the rows last read, for the failure message

        def evaluated() -> dict:
            # An image's identity comes with the worker's KV events; on a loaded machine they
            # may land after the first evaluation, and the job evaluates the request again then.
            # The warm-up is left out: it may run before the event plane's subscription has
            # reached the publisher (a ZMQ subscriber misses what came before it joined), so
            # its image's blocks may never be seen.
            c.runner.flush()
            rows = {r.request_id: r for r in c.store.availability_rows(0.0)
                    if r.request_id in wanted}
            seen[:] = [(r.request_id, r.identities_resolved, r.evidence) for r in rows.values()]
            done = set(rows) == wanted and all(r.identities_resolved for r in rows.values())
            return rows if done else {}

        try:
            found = wait_until(evaluated, 15, interval=0.5,
                               what="every request evaluated with its images' identities")
        except AssertionError as exc:
            health = [(h.collector, h.counters, h.errors) for h in c.runner.all_health()]
            raise AssertionError(f"{exc}; rows: {seen}; kv: {c.store.kv_event_counts()}; "
                                 f"health: {health}") from None
    assert {t.request_id for t in seeds + repeats} <= set(found)
    for r in found.values():
        assert r.avoidable_tokens == 0 and r.causes == {}, r
        assert r.fidelity == "exact" and r.identities_resolved and r.false_hit_tokens == 0
    for seed, repeat in zip(seeds, repeats, strict=True):
        got = found[repeat.request_id]
        assert repeat.worker == seed.worker
        cacheable = (got.prompt_tokens - 1) // 16 * 16
        assert got.available == {seed.worker: cacheable}
        assert got.best_tokens == got.realized_tokens == cacheable > 0
