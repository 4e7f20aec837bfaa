"""Available vs achieved on the embedded demo: the real SMG 1.13 router, simulated vLLM
workers, and mmlens' collector (KV events, the trace sink, the availability job).

SMG keys blocks by token ids only, so a second image of the same size meets a false hit on
the first one's worker; with its spill gate at zero margin, a request whose worker is busy
spills to the other worker and loses what the first one held.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from threading import Thread

import pytest
from mmlens.collectors.traces import solid_png
from mmlens.demo.cluster import Cluster

from mmlens.records import Availability
from tests.demo.support import metric_value, running_cluster
from tests.live_support import collecting, wait_until

pytestmark = [pytest.mark.live, pytest.mark.slow]

TEXT = "Describe this image in detail please."
RED, BLUE = (200, 30, 30), (30, 30, 200)
# 640×480 on Qwen3-VL: 300 image tokens in a 317-token prompt, 19 full blocks (the last
# token is in the partial 20th), all of which an engine can hit.
CACHEABLE = 304


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # A spill gate with no margin (load above the mean spills), and decoding slow enough that
    # a long request keeps its worker busy while the next one is routed.
    with running_cluster(speed=0.03, extra_smg_args=[
            "--balance-abs-threshold", "0", "--balance-rel-threshold", "1.0"]) as c:
        yield c


def test_false_hit_and_forced_spill(cluster: Cluster, tmp_path: Path) -> None:
    info = cluster.ready_info()
    with collecting(info, tmp_path / "live.db") as c:
        def send(color: tuple[int, int, int], max_tokens: int = 4):
            return c.send(solid_png(640, 480, color), TEXT, "smg", max_tokens)

        # The ZMQ subscriptions are live once a first request's blocks reach the store.
        warm = send((9, 9, 9))
        wait_until(c.stored_blocks, 15, what="the warm-up request's KV events stored")
        a = send(RED)
        b = send(BLUE)
        assert b.worker == a.worker  # SMG's content-blind hit on A's blocks
        busy = Thread(target=send, args=(RED, 400))
        busy.start()
        metrics = next(w["metrics"] for w in info["workers"] if w["url"] == a.worker)
        wait_until(lambda: metric_value(metrics, "vllm:num_requests_running") >= 1, 10,
                   what="a long request running on A's worker")
        a2 = send(RED)
        busy.join()
        c.runner.flush()  # drains the last events and evaluates every request (settle 0)
        found = {r.request_id: r for r in c.store.availability_rows(0.0)}
    assert warm.request_id in found and all(r.identities_resolved for r in found.values())

    # B's image starts in block 0: A's worker held none of B's blocks, nobody did, so nothing
    # was avoidable; everything SMG credited that worker with was a content-blind false hit.
    fb: Availability = found[b.request_id]
    assert (fb.best_tokens, fb.chosen_tokens, fb.realized_tokens) == (0, 0, 0)
    assert fb.avoidable_tokens == 0 and fb.causes == {}
    credited = next(p.overlap_blocks for p in b.predictions if p.overlap_blocks is not None)
    assert credited * 16 == CACHEABLE  # the whole prompt, by token ids
    assert (fb.false_hit_tokens, fb.false_hit_cause) == (credited * 16, "content_blind")

    spill: Availability = found[a2.request_id]
    assert a2.worker != a.worker, "SMG did not spill"
    assert spill.available[a.worker] == CACHEABLE and spill.best_worker == a.worker
    assert spill.realized_tokens == 0 and spill.causes == {"load_spill": CACHEABLE}
