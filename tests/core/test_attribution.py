"""KV-chain attribution under concurrency: which stored chain belongs to which request when
many ran on one worker at once, on hand-built sequences and on the events of the demo's
worker simulation (its vLLM-like prefix cache) at 16 requests in flight."""

from __future__ import annotations

import random

from mmlens.demo.prefix_cache import MediaSpan, PrefixCache, StoredBlocks

from mmlens.analysis.judgement.attribution import Served, WorkerChains, attribute, decode_tips

BS = 16


def chains_of(*events: tuple[float, int | None, list[int]]) -> WorkerChains:
    c = WorkerChains()
    for ts, parent, hashes in events:
        c.stored(ts, None if parent is None else str(parent), [str(h) for h in hashes])
    return c


def served(rid: str, start: float, blocks: int, end: float | None = None,
           known: int | None = None) -> Served:
    return Served(rid, start, start + 1.0 if end is None else end, blocks * BS + 3, BS, known)


def test_lengths_and_parents_tell_concurrent_requests_apart():
    c = chains_of((0.0, None, list(range(10))),  # an earlier request's 10 blocks
                  (5.2, None, [100 + i for i in range(6)]),  # "a": 6 blocks from the root
                  (5.3, 9, [200 + i for i in range(4)]),  # "b": 14 blocks, 10 reused
                  (5.4, 3, [300 + i for i in range(8)]))  # "c": 12 blocks, 4 reused
    got = attribute(c, [served("a", 5.0, 6), served("b", 5.0, 14), served("c", 5.1, 12)], "w1")
    assert {r: (v.blocks, v.alternatives) for r, v in got.items()} == {
        "a": (0, ()), "b": (10, ()), "c": (4, ())}


def test_a_request_that_stored_nothing_had_its_prompt_cached():
    c = chains_of((0.0, None, list(range(10))), (9.0, None, [500]))  # later: events flow
    (v,) = attribute(c, [served("r", 5.0, 10)], "w1").values()
    assert (v.blocks, v.alternatives) == (10, ())  # (10*16+3-1)//16: all full blocks hit
    # Until the worker's events are known past the request's end, nothing is said.
    assert attribute(chains_of((0.0, None, list(range(10)))), [served("r", 5.0, 10)],
                     "w1") == {}


def test_same_length_requests_at_once_get_both_readings():
    c = chains_of((0.0, None, list(range(10))), (5.3, 9, [200, 201]), (5.4, None,
                                                                       list(range(300, 312))))
    got = attribute(c, [served("x", 5.0, 12), served("y", 5.05, 12)], "w1")
    for rid in ("x", "y"):
        assert (got[rid].blocks, got[rid].alternatives) == (10, (0,))
        assert got[rid].reason == "2 requests of 12 blocks on w1 at once"
    # The engine's own count for one of them settles the other.
    got = attribute(c, [served("x", 5.0, 12, known=0), served("y", 5.05, 12)], "w1")
    assert (got["x"].blocks, got["y"].blocks, got["y"].alternatives) == (0, 10, ())


def test_a_chain_stored_before_the_request_started_is_not_its():
    c = chains_of((4.0, None, list(range(8))), (9.0, None, [900]))
    (v,) = attribute(c, [served("late", 5.0, 8)], "w1").values()
    assert v.blocks == 8  # the earlier request stored all 8 full blocks: this one found them


def _simulated(seed: int, waves: int = 12, in_flight: int = 16):
    """Requests through the demo's prefix cache, 16 allocated before any commits (so some
    compute blocks another is computing too), then decode blocks; events with times."""
    rng = random.Random(seed)
    cache = PrefixCache(block_size=BS, num_blocks=20_000)
    prefixes = [[rng.randrange(1000, 5000) for _ in range(rng.choice((40, 90, 170)))]
                for _ in range(6)]
    rows, requests, truth = [], [], {}
    t = 0.0
    for wave in range(waves):
        live = []
        for i in range(in_flight):
            rid = f"r{wave}-{i}"
            base = rng.choice(prefixes)
            tokens = base + [rng.randrange(5000, 9000) for _ in range(rng.randrange(1, 60))]
            media = [MediaSpan(f"img{rng.randrange(3)}", 5, 30)] if rng.random() < 0.5 else []
            start = t + i * 0.01
            events: list = []
            alloc = cache.allocate(tokens, media, events)
            live.append((rid, start, tokens, alloc, events))
            truth[rid] = alloc.hit_blocks
        for k, (rid, start, tokens, alloc, events) in enumerate(live):
            commit = t + 0.2 + k * 0.02
            cache.commit(alloc, events)
            stamp = [(commit, e) for e in events]
            cache.extend(alloc, [rng.randrange(9000, 9999) for _ in range(20)], more := [])
            stamp += [(commit + 0.3, e) for e in more]
            for ts, e in stamp:
                if isinstance(e, StoredBlocks):
                    rows.append((ts, None if e.parent_block_hash is None
                                 else str(e.parent_block_hash),
                                 [str(h) for h in e.block_hashes]))
            end = commit + 0.4
            requests.append(Served(rid, start, end, len(tokens), BS))
            cache.release(alloc)
        t += 2.0
    rows.sort(key=lambda r: r[0])
    return rows, requests, truth


def test_demo_worker_events_at_16_in_flight():
    for seed in range(3):
        rows, requests, truth = _simulated(seed)
        chains = WorkerChains()
        for ts, parent, hashes in rows:
            chains.stored(ts, parent, hashes)
        chains.stored(1e9, None, ["tail"])  # the stream went on after the last request
        got = attribute(chains, requests, "w1")
        definite = {r: v for r, v in got.items() if not v.alternatives}
        for rid, v in got.items():  # every reading given includes the truth
            assert truth[rid] in (v.blocks, *v.alternatives), (seed, rid, v, truth[rid])
        for rid, v in definite.items():  # and every definite one is it
            assert v.blocks == truth[rid], (seed, rid, v, truth[rid])
        # What a matching of chains to requests proves (the rest get every reading): about
        # half here, where all 16 allocate before any stores.
        assert len(definite) >= 0.45 * len(requests), (seed, len(definite), len(requests))


def test_a_request_of_unknown_length_is_a_rival_not_an_answer():
    # "r" (10 blocks) and a request whose prompt length nobody logged ran at once; the one
    # chain of 10 blocks from the root may be either's.
    c = chains_of((0.0, None, list(range(10))), (5.3, None, [100 + i for i in range(10)]),
                  (9.0, None, [900]))
    unknown = Served("q", 5.0, 6.0, None, BS)
    got = attribute(c, [served("r", 5.0, 10), unknown], "w1")
    assert set(got) == {"r"} and (got["r"].blocks, got["r"].alternatives) == (0, (10,))


def test_a_request_of_unknown_length_alone_with_a_root_chain_found_nothing():
    # SMG logs no length for a text request or a first sight; alone on the worker, the one
    # chain stored while it ran is its own. From the root: nothing cached. Off a cached
    # block: how deep it started needs the length, so it stays unknown.
    c = chains_of((0.0, None, list(range(10))), (5.3, None, [100]), (8.3, 9, [200, 201]))
    got = attribute(c, [Served("text", 5.0, 6.0, None, BS), Served("q", 8.0, 9.0, None, BS)],
                    "w1")
    assert set(got) == {"text"} and (got["text"].blocks, got["text"].alternatives) == (0, ())


def test_chains_two_requests_must_own_leave_the_third_its_own():
    # "a" and "b" ended before "c" started; three 10-block chains from the root: the first
    # two only "a" and "b" can have stored, so the third (which all three may have) is c's.
    c = chains_of((0.0, None, list(range(10))), (5.1, None, [100 + i for i in range(10)]),
                  (5.2, None, [200 + i for i in range(10)]),
                  (5.3, None, [300 + i for i in range(10)]), (9.0, None, [900]))
    got = attribute(c, [served("a", 5.0, 10, end=5.35), served("b", 5.0, 10, end=5.35),
                        served("c", 5.25, 10)], "w1")
    assert {r: (v.blocks, v.alternatives) for r, v in got.items()} == {
        "a": (0, ()), "b": (0, ()), "c": (0, ())}
    # Without "b", one of the three chains is nobody's here: "c" may have stored nothing.
    got = attribute(c, [served("a", 5.0, 10, end=5.35), served("c", 5.25, 10)], "w1")
    assert got["c"].alternatives and got["a"].blocks == 0


def test_a_decode_block_from_the_root_may_be_a_short_prompts():
    # "short" (under a block) decodes one block from the root; "t" (one block) found its
    # block cached earlier. The root block stored while both ran may be short's decode, so
    # it is no proof that "t" computed its block.
    c = chains_of((0.0, None, [1]), (5.2, None, [7]), (9.0, None, [900]))
    got = attribute(c, [Served("short", 5.0, 5.5, 15, BS), Served("t", 5.1, 5.5, 18, BS)],
                    "w1")
    assert got["short"].blocks == 0
    assert {got["t"].blocks, *got["t"].alternatives} == {0, 1}


def test_the_prompt_length_smg_logs_where_the_engine_tells_none():
    from mmlens.analysis.judgement.batch import prompt_of
    from mmlens.ingest.observed import fragment
    from mmlens.records import RoutingDecision

    def logged(**fields) -> int | None:
        t = fragment("r", "router_log", 1.0, "smg")
        t.predictions = [RoutingDecision("r", "smg", "log:x", **fields)]
        return prompt_of(t, BS)

    assert logged(expanded_tokens=84) == 84  # Token expansion complete: the engine's count
    assert logged(input_units=81, prediction_source="approximate_tree") == 81  # tokens
    assert logged(input_units=5, prediction_source="event_index_overlap") is None  # blocks
    assert logged(request_blocks=0) == 1  # a text prompt under a block: nothing to hit
    assert logged(request_blocks=5) == 81


def test_image_identities_tell_same_length_requests_apart():
    # Two 5-block requests at once: "x" of image B (on the worker already), "y" of a new
    # image A, which stored a chain from the root. Without identities either may have; with
    # them (Dynamo logs each image's hash, the first 8 bytes of the one its engine keys
    # blocks by) the chain of A is y's and x found its prompt cached.
    a_id, b_id = "aaaa1111aaaa1111" + "0" * 48, "bbbb2222bbbb2222" + "0" * 48
    c = WorkerChains()
    c.stored(1.0, None, ["b1", "b2", "b3", "b4", "b5"], [b_id])
    c.stored(5.2, None, ["a1", "a2", "a3", "a4", "a5"], [a_id])
    c.stored(5.35, "a5", ["a6"])  # y's decode: off its prompt's last block, no image
    c.stored(9.0, None, ["tail"])
    blind = attribute(c, [served("x", 5.0, 5), served("y", 5.1, 5)], "w1")
    assert all(set(v.alternatives) | {v.blocks} == {0, 5} for v in blind.values())
    x = Served("x", 5.0, 6.0, 5 * BS + 3, BS, images=frozenset({b_id[:16]}))
    y = Served("y", 5.1, 6.0, 5 * BS + 3, BS, images=frozenset({a_id[:16]}))
    seen = attribute(c, [x, y], "w1")
    assert {r: (v.blocks, v.alternatives) for r, v in seen.items()} == {
        "x": (5, ()), "y": (0, ())}
    assert c.segment_of["a6"].images == c.segment_of["a1"].images  # the chain's, below it


def test_a_block_hung_off_a_prompt_may_be_a_longer_prompts_not_only_its_decode():
    # "a" (5 blocks) and "b" (6, its first 5 the same: one image, a longer text) computed
    # at once from nothing; the engine stored the five shared blocks once (a's chain) and
    # b's sixth off their last. That block may be a's decode, but also b's prompt: b may
    # have computed all six (the live Dynamo run's acc-041, once judged a hit).
    c = chains_of((0.0, None, [1]), (5.2, None, [10, 11, 12, 13, 14]), (5.202, 14, [15]),
                  (9.0, None, [900]))
    got = attribute(c, [served("a", 5.0, 5), served("b", 5.05, 6)], "w1")
    assert got["a"].blocks == 0
    assert 0 in {got["b"].blocks, *got["b"].alternatives}


def test_a_length_from_a_rounded_up_block_count_may_fill_its_last_block():
    # Dynamo logs 6 blocks for "r": 81 to 96 tokens, 5 or 6 full blocks. At 96 its cold
    # chain of 6 blocks from the root is its own; "y" (6 full blocks, found cached at 1.0)
    # stored nothing. Were r's prompt taken as 81 tokens only, y alone could own that chain
    # and would read cold.
    c = chains_of((1.0, None, [1, 2, 3, 4, 5, 6]), (5.2, None, [10, 11, 12, 13, 14, 15]),
                  (9.0, None, [900]))
    y = served("y", 5.0, 6)
    assert attribute(c, [y, Served("r", 5.0, 6.0, 81, BS)], "w1")["y"].blocks == 0  # the trap
    got = attribute(c, [y, Served("r", 5.0, 6.0, 81, BS, one_more=True)], "w1")
    assert 6 in {got["y"].blocks, *got["y"].alternatives}
    assert 0 in {got["r"].blocks, *got["r"].alternatives}
    # And the count itself: a Dynamo record's shortest length, marked as rounded up.
    from mmlens.analysis.judgement.batch import prompt_told
    from mmlens.ingest.observed import fragment
    from mmlens.records import RoutingDecision

    t = fragment("d", "router_log", 1.0, "dynamo")
    t.predictions = [RoutingDecision("d", "dynamo", "log:routing_best", request_blocks=6)]
    assert prompt_told(t, BS) == (81, True, False)


A_ID, B_ID = "a" * 16 + "0" * 48, "b" * 16 + "0" * 48


def _two_images() -> WorkerChains:
    """Image B's 7-block chain stored at 0.5, image A's at 1.2 (the requests of 7 blocks)."""
    c = WorkerChains()
    c.stored(0.5, None, ["b1", "b2", "b3", "b4", "b5", "b6", "b7"], [B_ID])
    c.stored(1.2, None, ["a1", "a2", "a3", "a4", "a5", "a6", "a7"], [A_ID])
    return c


def sized(rid: str, start: float, end: float, size: tuple[int, int]) -> Served:
    return Served(rid, start, end, 7 * BS + 3, BS, sizes=(size,))


def test_an_images_size_learned_from_its_own_chain_rules_out_other_sizes():
    # SMG logs sizes, no identities. "a" (a 320×320 image, 7 blocks, alone at first) stored
    # the chain of image A; "b" (a 384×256 image) and "c" (320×320), both 7 blocks, ran
    # later at once, and one chain of A was stored while they ran besides c's. Image A is
    # 320×320 (a's chain): b cannot own a chain of it, so the chain of A off the root is
    # c's... and b found its prompt cached.
    c = _two_images()
    c.stored(5.2, "a6", ["c7"])
    c.stored(9.0, None, ["tail"])
    runs = [sized("a", 1.0, 1.5, (320, 320)), sized("b", 5.0, 6.0, (384, 256)),
            sized("c", 5.05, 6.0, (320, 320))]
    got = attribute(c, runs, "w1")
    assert (got["a"].blocks, got["a"].alternatives) == (0, ())
    assert (got["b"].blocks, got["b"].alternatives) == (7, ())
    assert (got["c"].blocks, got["c"].alternatives) == (6, ())
    # Without the sizes either of b and c may have stored c7.
    blind = attribute(c, [Served(r.request_id, r.start, r.end, r.prompt_tokens, BS)
                          for r in runs], "w1")
    assert blind["b"].alternatives and blind["c"].alternatives


def test_on_vllm_a_request_that_stored_nothing_found_what_another_stored_while_it_ran():
    # "r" (12 full blocks) stored nothing while "o" stored 14 blocks from the root, the
    # first 12 of them "r"'s. An engine that stores a block once (SGLang) may have had "r"
    # compute them too; vLLM stores every block it computes (a copy beside the one there):
    # "r" found them cached.
    c = chains_of((5.2, None, list(range(100, 114))), (9.0, None, [900]))
    runs = [served("o", 5.0, 14, end=5.5), served("r", 5.1, 12)]
    got = attribute(c, runs, "w1")
    assert (got["r"].blocks, got["r"].alternatives) == (12, (0,))
    assert got["r"].reason == "another request on w1 stored blocks of its prompt while it ran"
    got = attribute(c, runs, "w1", announces_all=True)
    assert (got["r"].blocks, got["r"].alternatives) == (12, ())


def test_on_vllm_a_chain_found_below_a_requests_own_segment_was_not_computed_by_it():
    # "r" stored 4 blocks off block 107 of the chain "o" stored while "r" ran: it found the
    # 8 below cached (vLLM), or computed them too (an engine that stores a block once).
    c = chains_of((5.2, None, list(range(100, 110))), (5.3, 107, [200, 201, 202, 203]),
                  (9.0, None, [900]))
    runs = [served("o", 5.0, 10, end=5.5), served("r", 5.1, 12)]
    got = attribute(c, runs, "w1")["r"]
    assert (got.blocks, got.alternatives) == (8, (0,))
    got = attribute(c, runs, "w1", announces_all=True)["r"]
    assert (got.blocks, got.alternatives) == (8, ())


def test_a_block_stored_twice_stays_until_both_copies_are_removed():
    c = chains_of((1.0, None, [1, 2, 3]), (2.0, 2, [3]))  # block 3 computed again
    c.removed(3.0, ["3"])
    assert c.depth.get("3") == 3
    c.stored(4.0, "3", ["4"])
    assert c.segments[-1].base == 3  # hung off the copy left
    c.removed(5.0, ["3"])
    assert "3" not in c.depth and "3" not in c.segment_of and not c.copies


def test_sizes_learned_in_one_pass_rule_out_chains_in_another():
    # "a" (320×320, alone) stored image A's chain: A is 320×320. Later "b" (384×256) and
    # "c" (320×320), both 7 blocks, ran at once on another stretch of the worker: a chain
    # of A off the root and one block off image B's chain were stored. Judged on their own
    # either may be the one that found B's blocks; with A's size known, b cannot own A's
    # chain: it stored the block off B's (6 cached), c computed A's anew.
    c = _two_images()
    c.stored(5.1, None, ["x1", "x2", "x3", "x4", "x5", "x6", "x7"], [A_ID])
    c.stored(5.2, "b6", ["y7"])
    c.stored(9.0, None, ["tail"])
    learned: dict[str, tuple[int, int]] = {}
    attribute(c, [sized("a", 1.0, 1.5, (320, 320))], "w1", sizes=learned)
    assert learned == {"a" * 16: (320, 320)}
    later = [sized("b", 5.0, 6.0, (384, 256)), sized("c", 5.05, 6.0, (320, 320))]
    alone = attribute(c, later, "w1")
    assert alone["b"].alternatives and alone["c"].alternatives
    got = attribute(c, later, "w1", sizes=learned)
    assert (got["b"].blocks, got["b"].alternatives) == (6, ())
    assert (got["c"].blocks, got["c"].alternatives) == (0, ())


def test_on_vllm_a_copy_of_a_block_held_before_a_request_started_is_not_its_prompt():
    # Block 1 was stored at 1.0. While "r" (26 tokens: one full block, all of it hittable)
    # ran, a copy of block 1 came from the root: a 16-token prompt found whole recomputes
    # its last block (vLLM keeps the copy). Had "r" computed that block, it would have
    # found the one stored at 1.0 first: "r" found its prompt cached, the copy is another's.
    c = chains_of((1.0, None, [1]), (5.5, None, [1]), (9.0, None, [900]))
    runs = [Served("r", 5.0, 6.0, 26, BS)]
    assert attribute(c, runs, "w1")["r"].blocks == 0  # an engine that stores once: its own
    got = attribute(c, runs, "w1", announces_all=True)["r"]
    assert (got.blocks, got.alternatives) == (1, ())
    # A copy whose first block came after "r" started may still be its.
    late = chains_of((5.2, None, [1]), (5.5, None, [1]), (9.0, None, [900]))
    assert 0 in {(g := attribute(late, runs, "w1", announces_all=True)["r"]).blocks,
                 *g.alternatives}


def _swappable_pair(decodes: bool, same_length: bool = False, rival: bool = False) -> dict:
    """Two requests of 5 full blocks at once on a vLLM worker, different images of one size:
    "a" (90 tokens) found image X's chain, stored before; "b" (81 tokens, or 90) computed
    image Y's. Their decode blocks hang off their own prompt's last block; with the prompt's
    end in them (``prompt_end``: 10 tokens of a's, 1 of b's), each names its owner."""
    c = WorkerChains()
    c.stored(0.0, None, [f"x{i}" for i in range(5)])  # an earlier request's: image X
    c.stored(5.1, None, [f"y{i}" for i in range(5)])  # b's prefill: image Y
    b_len = 90 if same_length else 81
    if decodes:
        c.stored(5.3, "x4", ["xd"], prompt_end=10)  # a's first decode block
        c.stored(5.5, "y4", ["yd"], prompt_end=b_len % BS)  # b's
    c.stored(9.0, None, ["later"])
    a = Served("a", 5.0, 6.0, 90, BS, exact=True)
    b = Served("b", 5.05, 6.0, b_len, BS, exact=True)
    # A request whose length is told by its block count only (5 full blocks): it may have
    # hung either decode block, so neither names its owner.
    c_ = Served("c", 5.2, 6.0, 81, BS)
    return attribute(c, [a, b, c_] if rival else [a, b], "w1", announces_all=True)


def test_a_decode_block_that_ends_a_prompt_tells_swappable_requests_apart():
    """Without the decode blocks' prompt ends either may have computed Y's chain; with them
    the one of 90 tokens hung its decode off X's chain, so it found its prompt cached. Two
    requests of one length stay two readings, and so do both beside a request of that many
    full blocks whose exact length nobody told."""
    def readings(got: dict) -> dict[str, set[int]]:
        return {r: {v.blocks, *v.alternatives} for r, v in got.items()}

    assert readings(_swappable_pair(decodes=False)) == {"a": {0, 5}, "b": {0, 5}}
    assert readings(_swappable_pair(decodes=True)) == {"a": {5}, "b": {0}}
    got = _swappable_pair(decodes=True, same_length=True)
    assert all(v.alternatives for v in got.values())
    got = _swappable_pair(decodes=True, rival=True)
    assert got["a"].alternatives and got["b"].alternatives


def _one_length_pair(both_decodes: bool) -> dict:
    """Two requests of 114 tokens (7 full blocks and 2) at once on a vLLM worker, "p" and
    "q", each found image X's 6 blocks and computed its own 7th; "s" (120 tokens) computed
    a chain of 7 from the root (its reply ended before it filled a decode block). p's and
    q's decode blocks end 2 tokens in: each is one of theirs, not whose is whose."""
    c = WorkerChains()
    c.stored(0.0, None, [f"x{i}" for i in range(6)])  # an earlier request's: image X
    c.stored(5.1, "x5", ["p7"])
    c.stored(5.12, "x5", ["q7"])
    c.stored(5.15, None, [f"z{i}" for i in range(7)])  # s's prefill
    c.stored(5.3, "p7", ["pd"], prompt_end=2)
    if both_decodes:
        c.stored(5.35, "q7", ["qd"], prompt_end=2)
    c.stored(9.0, None, ["later"])
    served = [Served("p", 5.0, 6.0, 114, BS, exact=True),
              Served("q", 5.02, 6.0, 114, BS, exact=True),
              Served("s", 5.05, 6.0, 120, BS, exact=True)]
    return attribute(c, served, "w1", announces_all=True)


def test_decode_blocks_of_one_length_pair_off_with_their_requests():
    """Two decode blocks of one length for two requests of it: each request's prompt ends
    at one of the two blocks they hang off, so neither computed the chain of 7 (a hit of 6
    whichever is whose) and s did. With one of the two missing, no count holds: p or q may
    have computed that chain, and s found it."""
    def readings(got: dict) -> dict[str, set[int]]:
        return {r: {v.blocks, *v.alternatives} for r, v in got.items()}

    assert readings(_one_length_pair(both_decodes=True)) == {"p": {6}, "q": {6}, "s": {0}}
    assert readings(_one_length_pair(both_decodes=False)) == {key: {0, 6} for key in "pqs"}


def _counted_by_blocks(decodes: bool) -> dict:
    """"t" (text only: SMG counted 1 full block, its length no more) and "u" (23 tokens, told
    exactly) at once; u found an earlier request's block b0, t computed a0."""
    c = WorkerChains()
    c.stored(0.0, None, ["b0"])
    c.stored(5.1, None, ["a0"])
    if decodes:
        c.stored(5.3, "a0", ["td"], prompt_end=3)
        c.stored(5.35, "b0", ["ud"], prompt_end=7)  # 7 tokens in: 16 + 7 = 23, u's
    c.stored(9.0, None, ["later"])
    served = [Served("t", 5.0, 6.0, 17, BS), Served("u", 5.02, 6.0, 23, BS, exact=True)]
    return attribute(c, served, "w1", announces_all=True)


def test_a_request_whose_blocks_a_router_counted_owns_a_decode_block_too():
    """A request whose full blocks the router counted may own any decode block at that
    depth, one whose length is told only those that end where it does: the block 7 tokens
    in is u's (t may own either, u only that one), so the other is t's, and t computed a0
    while u found b0. Without the decode blocks either may have done either."""
    def readings(got: dict) -> dict[str, set[int]]:
        return {r: {v.blocks, *v.alternatives} for r, v in got.items()}

    assert readings(_counted_by_blocks(decodes=True)) == {"t": {0}, "u": {1}}
    assert readings(_counted_by_blocks(decodes=False)) == {"t": {0, 1}, "u": {0, 1}}
    # An approximate tree's units count no blocks: such a request may own any decode block
    # it ran for, so none pairs off.
    c = WorkerChains()
    c.stored(5.1, None, ["a0"])
    c.stored(5.3, "a0", ["td"], prompt_end=3)
    tree = Served("v", 5.0, 6.0, 17, BS, approx=True)
    assert decode_tips(c, [Served("t", 5.0, 6.0, 17, BS), tree], 0.05) == {}
    assert decode_tips(c, [Served("t", 5.0, 6.0, 17, BS)], 0.05) == {"t": frozenset({"a0"})}


def test_where_a_prompt_ends_in_a_block():
    from array import array

    from mmlens.ingest.prompt_end import opening, prompt_end, suffix_bytes

    gen = suffix_bytes([151644, 77091, 198])  # Qwen's <|im_start|>assistant\n
    tail = [11, 12, 151645, 198, 151644, 77091, 198]  # prompt's last 7 tokens
    assert prompt_end(tail + list(range(500, 509)), gen, BS) == 7
    assert prompt_end(array("I", tail + list(range(500, 509))), gen, BS) == 7
    assert prompt_end(list(range(500, 516)), gen, BS) is None  # all generated
    assert prompt_end(list(range(9)) + tail, gen, BS) is None  # a prompt of whole blocks
    assert prompt_end(tail, gen, BS) is None  # not a whole block
    assert prompt_end([-1, 2**40] + [1] * 14, gen, BS) is None  # no ids: nothing, no raise
    # Begun in the previous block: "assistant\n" opens this one, the prompt's last 2 tokens;
    # a lone newline opening a block says nothing (any reply may begin with one).
    assert prompt_end([77091, 198, *range(500, 514)], gen, BS) == 2
    assert prompt_end([198, *range(500, 515)], gen, BS) is None
    assert prompt_end([198, *range(500, 515)], gen, BS, opened=2) == 1  # hung off one ending 2
    assert prompt_end([77091, 198, *range(500, 514)], gen, BS, opened=1) == 2
    assert opening([*range(500, 514), 151644, 77091], gen) == 2
    assert opening([*range(500, 515), 151644], gen) == 1
    assert opening([*range(500, 513), *[151644, 77091, 198]], gen) == 0  # the whole of it
    assert prompt_end([77091, 198, *range(500, 507), *tail], gen, BS) is None
    # Bytes that match across token boundaries are no match.
    assert prompt_end([0x03040000, 0x00000102] + [1] * 14, suffix_bytes([0x01020304]),
                      BS) is None
