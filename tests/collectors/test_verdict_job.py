"""The verdict job over a store: traces, logged decisions and KV events in, one verdict per
settled request out, re-judged once when KV events of its time arrive late."""

from __future__ import annotations

from mmlens.collectors.verdict_job import VerdictJob

from mmlens.records import BlockStored, CollectorHealth, RequestTrace, RoutingDecision
from mmlens.store.open import open_store

BS = 16


def observed(rid: str, ts: float, worker: str, prompt: int, latency: float = 1.0,
             ) -> RequestTrace:
    """A request seen in router logs only: worker, prompt and latency told, no cached count."""
    return RequestTrace(rid, "smg", "smg", "m", ts, False, worker=worker, prompt_tokens=prompt,
                        latency_s=latency, status=200, origin="observed", sources=["router_log"],
                        provenance={"worker": "router_log:smg", "prompt_tokens": "router_log:smg",
                                    "status": "router_log:smg", "latency_s": "router_log:smg"})


def decision(rid: str, worker: str, overlap: int, blocks: int, ts: float) -> RoutingDecision:
    return RoutingDecision(rid, "smg", "router_log:smg", worker=worker, branch="event_hit"
                           if overlap else "event_miss", overlap_blocks=overlap,
                           request_blocks=blocks, block_size=BS, ts=ts)


def stored(worker: str, seq: int, ts: float, hashes: list[int], parent: int | None,
           ) -> BlockStored:
    return BlockStored(worker, 0, seq, ts, hashes, parent, [1] * (BS * len(hashes)), BS)


def test_concurrent_requests_judged_from_their_chains_and_rejudged_on_late_events(
        store_db: str) -> None:
    store = open_store(store_db)
    # A seed stored 10 blocks; then three requests at once on w1: "warm" (its first 10
    # blocks cached, 4 new), "blue" (same 10 token blocks predicted, another image: all 14
    # computed from the root) and "fresh" (8 blocks, nothing predicted).
    seed = [1000 + i for i in range(10)]
    store.add_kv_events([stored("w1", 0, 10.5, seed, None)])
    store.add_traces([observed("seed", 10.0, "w1", 10 * BS + 3)])
    store.add_traces([observed("warm", 20.0, "w1", 14 * BS + 5, 2.0),
                      observed("blue", 20.1, "w1", 14 * BS + 5, 2.0),
                      observed("fresh", 20.2, "w1", 8 * BS + 1, 2.0)])
    store.add_decisions([decision("seed", "w1", 0, 10, 10.0), decision("warm", "w1", 10, 14, 20.0),
                         decision("blue", "w1", 10, 14, 20.1),
                         decision("fresh", "w1", 0, 8, 20.2)])
    store.add_kv_events([
        stored("w1", 1, 20.6, [2000 + i for i in range(8)], None),  # fresh, from the root
        stored("w1", 2, 20.7, [3000 + i for i in range(4)], seed[-1]),  # warm, off the seed
    ])
    job = VerdictJob(store, settle_s=5.0)
    assert job.run(now=15.0) == []  # nothing has settled yet
    (first,) = job.run(now=21.0)  # the seed ended at 11: settled; the others run still
    assert (first.request_id, first.category) == ("seed", "cold")
    got = {v.request_id: v for v in job.run(now=40.0)}
    assert set(got) == {"warm", "blue", "fresh"}
    assert (got["warm"].category, got["warm"].realized_blocks) == ("hit", 10)
    assert (got["fresh"].category, got["fresh"].realized_blocks) == ("cold", 0)
    # Lengths tell "fresh" apart. blue's own chain has not arrived: warm and blue share the
    # one 14-block chain, which says 10 cached for either (and the other's prompt was cached).
    assert (got["blue"].category, got["blue"].realized_blocks) == ("hit", 10)
    assert job.run(now=41.0) == []  # judged once
    # blue's chain from the root arrives late: one of the two same-length requests hit, the
    # other found nothing, and nothing in logs and events says which.
    store.add_kv_events([stored("w1", 3, 20.8, [4000 + i for i in range(14)], None)])
    again = {v.request_id: v for v in job.run(now=42.0)}
    assert set(again) == {"warm", "blue", "fresh"}  # the requests that ran at 20.8 on w1
    for rid in ("warm", "blue"):
        v = again[rid]
        assert (v.category, v.version) == ("hit_or_false_hit", 1)
        assert v.reason == "2 requests of 14 blocks on w1 at once"
        assert v.evidence["realized_alternatives"] == [0]
    assert again["fresh"].category == "cold"
    rows = store.verdicts_for(["blue", "warm", "seed"])
    assert rows["blue"].category == "hit_or_false_hit" and rows["blue"].version == 1
    assert rows["seed"].version == 0
    assert store.verdict_counts(0.0) == {"cold": 2, "hit_or_false_hit": 2}
    # Re-judged once: later rows for the same time change nothing more.
    store.add_kv_events([stored("w1", 4, 20.9, [5000], None)])
    assert job.run(now=43.0) == []
    assert (job.judged, job.rejudged) == (4, 3)
    store.close()


def test_an_idle_worker_drained_after_a_request_says_its_whole_prompt_was_cached(
        store_db: str) -> None:
    store = open_store(store_db)
    # w1 and w2 each stored a 10-block prompt, then served it again and stayed idle (an
    # engine stores nothing for a prompt it holds whole). Only w1's stream was drained
    # after the repeat ended (its resident summary written at 30): w2's silence says nothing.
    for w, base in (("w1", 1000), ("w2", 2000)):
        store.add_kv_events([stored(w, 0, 10.5, [base + i for i in range(10)], None)])
        store.add_traces([observed(f"{w}-first", 10.0, w, 10 * BS + 3),
                          observed(f"{w}-again", 20.0, w, 10 * BS + 3)])
        store.add_decisions([decision(f"{w}-first", w, 0, 10, 10.0),
                             decision(f"{w}-again", w, 10, 10, 20.0)])
    store.set_kv_state({"w1#0": {"worker": "w1", "rank": 0, "resident_blocks": 10}}, 30.0)
    store.set_kv_state({"w2#0": {"worker": "w2", "rank": 0, "resident_blocks": 10}}, 15.0)
    got = {v.request_id: v for v in VerdictJob(store, settle_s=5.0).run(now=40.0)}
    assert (got["w1-again"].category, got["w1-again"].realized_blocks) == ("hit", 10)
    assert got["w2-again"].category == "unknown"
    assert got["w1-first"].category == got["w2-first"].category == "cold"
    store.close()


def test_image_identities_from_the_log_meet_the_kv_events_images(store_db: str) -> None:
    # Dynamo's log names each image's hash; the engines' KV events key blocks by it. "warm"
    # (image B, on w1 already) and "new" (image A, its chain from the root) ran at once.
    from mmlens.records import ImageInfo, ImageRef

    store = open_store(store_db)
    a_id, b_id = "aaaa1111aaaa1111" + "0" * 48, "bbbb2222bbbb2222" + "0" * 48

    def imaged(hashes: list[int], seq: int, ts: float, image: str) -> BlockStored:
        ev = stored("w1", seq, ts, hashes, None)
        ev.images = [(ImageRef(image, 0),)] * len(hashes)
        return ev

    store.add_kv_events([imaged([1, 2, 3, 4, 5], 0, 1.0, b_id),
                         imaged([11, 12, 13, 14, 15], 1, 20.3, a_id)])
    traces = [observed(rid, ts, "w1", 5 * BS + 3) for rid, ts in (("warm", 20.0),
                                                                   ("new", 20.1))]
    for t, image in zip(traces, ("bbbb2222bbbb2222", "aaaa1111aaaa1111"), strict=True):
        t.images = [ImageInfo("data", tokens=64, identities={"dynamo_mm_hash": image})]
        t.provenance["images"] = "router_log:dynamo"
    store.add_traces(traces)
    store.add_kv_events([stored("w1", 2, 30.0, [99], None)])  # the stream went on
    got = {v.request_id: v for v in VerdictJob(store, settle_s=0.0).run(now=40.0)}
    assert (got["warm"].realized_blocks, got["warm"].evidence["realized_alternatives"]) == (
        5, [])
    assert (got["new"].realized_blocks, got["new"].evidence["realized_alternatives"]) == (
        0, [])


def test_the_engines_own_count_is_believed_however_the_kv_events_came(store_db: str) -> None:
    """A worker's span (cached tokens, as the engine counted them) reaches the row seconds
    after the router's log lines: the verdict read from KV chains meanwhile, and re-judged
    already when late KV rows came, is judged again from the engine's count once it is there."""
    store = open_store(store_db)
    seed = [1000 + i for i in range(10)]
    store.set_health([CollectorHealth("otlp", "grpc 127.0.0.1:4317")], 9.0)  # spans received
    store.add_kv_events([stored("w1", 0, 10.5, seed, None)])
    store.add_traces([observed("seed", 10.0, "w1", 10 * BS + 3),
                      observed("again", 20.0, "w1", 12 * BS + 3)])
    store.add_decisions([decision("seed", "w1", 0, 10, 10.0),
                         decision("again", "w1", 10, 12, 20.0)])
    store.add_kv_events([stored("w1", 1, 20.3, [2000, 2001], seed[-1])])
    job = VerdictJob(store, settle_s=5.0)
    got = {v.request_id: v for v in job.run(now=30.0)}
    assert got["again"].sources["realized"] == "kv_events"
    store.add_kv_events([stored("w1", 2, 20.8, [3000], None)])  # late: re-judged once
    assert {v.request_id: v.version for v in job.run(now=31.0)}["again"] == 1
    assert job.run(now=32.0) == []
    span = RequestTrace("again", "smg", "smg", "m", 20.0, False, cached_tokens=10 * BS,
                        origin="observed", sources=["otlp"],
                        provenance={"cached_tokens": "otlp:llm_request"})
    store.add_traces([span])  # merged into the row judged twice already
    (v,) = job.run(now=33.0)
    assert (v.request_id, v.version, v.sources["realized"]) == ("again", 2, "otlp:llm_request")
    assert (v.category, v.realized_blocks) == ("hit", 10)
    assert job.run(now=34.0) == []  # the engine's count is not replaced again
    store.close()
