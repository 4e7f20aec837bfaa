"""The policy and engine models on realistic sequences: repeated images, same-size different
images, text only, several sizes, a spill, a cache too small; and the models checked against
recorded runs of the real SMG 1.13 and Dynamo 1.6.1 (tests/fixtures/captures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmlens.whatif.blocks import BlockSizeError, Prompt, prompt
from mmlens.whatif.engine import EngineCache
from mmlens.whatif.replay import run
from mmlens.whatif.report import summarize, verdict_of
from mmlens.whatif.scenario import Scenario, ScenarioError, parse
from mmlens.whatif.workload import RecordedRequest
from tests.whatif.support import T0, TEXT, png, request

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"
RED, BLUE = png("solid", 64, 64, 1), png("solid", 224, 224, 2)  # both 64 image tokens
BIG = png("gradient", 640, 480, 3)  # 300 image tokens


def _seq(images: list[bytes | None], gap: float = 1.0) -> list[RecordedRequest]:
    return [request(f"r{i}", T0 + i * gap, [] if im is None else [im])
            for i, im in enumerate(images)]


def _cached(sc: Scenario, reqs: list[RecordedRequest]) -> list[int]:
    r = run(reqs, sc)
    return [h * sc.block_size for h in r.hit]


def test_the_engine_hits_a_repeat_but_never_the_last_token_and_evicts_lru() -> None:
    red = prompt(request("a", T0, [RED]), 16)
    big = prompt(request("b", T0, [BIG]), 16)
    assert red is not None and big is not None and red.tokens == 81
    cache = EngineCache(0, capacity_blocks=len(red.content) + 2)
    first = cache.admit(red.content, red.blind, red.tokens, 8, 16)
    again = cache.admit(red.content, red.blind, red.tokens, 8, 16)
    assert first.hit_blocks == again.hit_blocks == 0  # not committed yet: no hit
    cache.commit(first)
    cache.commit(again)
    cache.release(first)
    cache.release(again)
    assert cache.admit(red.content, red.blind, red.tokens, 8, 16).hit_blocks == 5  # 80 of 81
    small = EngineCache(0, capacity_blocks=8)
    a = small.admit(red.content, red.blind, red.tokens, 8, 16)
    small.commit(a)
    small.release(a)
    b = small.admit(big.content, big.blind, big.tokens, 8, 16)  # 21 blocks: evicts red
    assert small.evictions >= 5 and small.hit_blocks(red.content, 5) == 0
    assert b.hit_blocks == 0


def test_router_mode_is_content_blind_worker_mode_routes_images_on_load() -> None:
    reqs = _seq([RED, RED, BLUE, None, None, BLUE, RED])
    smg = run(reqs, Scenario("cache_aware", "router", workers=2))
    # Blue has red's 64 tokens: SMG sends it to red's worker, whose engine holds nothing of it.
    assert smg.worker[2] == smg.worker[0] and smg.branch[2] == "event_hit"
    assert smg.predicted[2] == 5 and smg.hit[2] == 0 and verdict_of(smg, 2) == "false_hit"
    assert smg.hit[1] == 5 and verdict_of(smg, 1) == "hit"
    assert smg.hit[4] == 0 and verdict_of(smg, 3) == "cold"  # 15 tokens: nothing to cache
    worker = run(reqs, Scenario("cache_aware", "worker", workers=2))
    # One anchor per image: no block of an image request matches the engines' blocks.
    assert {worker.branch[i] for i in (1, 2, 5, 6)} == {"event_miss"}
    assert worker.predicted[2] == 0
    dyn = run(reqs, Scenario("dynamo_kv", "exact", workers=2))
    assert dyn.hit[1] == 5 and dyn.predicted[2] == 0  # mm_hash keys: blue is new
    assert dyn.hit[5] == 5 and dyn.worker[5] == dyn.worker[2]  # blue again, on blue's worker
    assert sum(summarize(dyn, ["w0", "w1"], None).total.verdicts.values()) == len(reqs)


def test_text_prefix_fallback_matches_only_text_before_the_image() -> None:
    long_text = TEXT + " " + "Answer in one long paragraph about the colours." * 4
    reqs = [request("t0", T0, [], long_text), request("t1", T0 + 1, [], long_text),
            request("i0", T0 + 2, [RED], long_text), request("i1", T0 + 3, [BLUE], long_text)]
    exact = run(reqs, Scenario("dynamo_kv", "exact", workers=2))
    fallback = run(reqs, Scenario("dynamo_kv", "text_prefix", workers=2))
    assert exact.predicted[1] > 0 and fallback.predicted[1] == exact.predicted[1]
    assert fallback.predicted[3] == 0 and verdict_of(fallback, 3) in {"cold", "fallback"}
    approx = run(reqs, Scenario("dynamo_kv", "approximate", workers=2))
    assert approx.predicted[1] == len(prompt(reqs[1], 16).content)  # its own record
    assert approx.hit[1] == exact.hit[1]


def test_a_smaller_cache_evicts_and_the_router_believes_what_is_gone() -> None:
    sizes = [png("noise", 640, 480, s) for s in range(6)]
    reqs = _seq([sizes[i % 6] for i in range(24)], gap=0.5)
    full = run(reqs, Scenario("cache_aware", "router", workers=2, capacity_blocks=4096))
    small = run(reqs, Scenario("cache_aware", "router", workers=2, capacity_blocks=40))
    assert full.evictions == 0 and small.evictions > 0
    assert sum(small.hit) < sum(full.hit)
    assert sum(full.hit) > 0


def test_a_spill_gate_that_fires_sends_the_repeat_elsewhere() -> None:
    # Six red requests in flight at once: with abs 0 and rel 1.0 the loaded worker spills.
    reqs = [request(f"s{i}", T0 + i * 0.01, [RED], latency=5.0, ttft=0.001) for i in range(6)]
    tight = run(reqs, parse("policy=cache_aware,balance_abs_threshold=0,"
                            "balance_rel_threshold=1.0", Scenario(workers=2)))
    assert "spill" in tight.branch
    assert len(set(tight.worker)) == 2
    default = run(reqs, Scenario("cache_aware", "router", workers=2))
    assert "spill" not in default.branch and len(set(default.worker[1:])) == 1


def test_the_spill_margin_is_capped_at_the_in_flight_swing_of_a_small_fleet() -> None:
    # Twelve red requests in flight on two workers, default thresholds (abs 64): the margin
    # over the mean is max(2·sqrt(mean), 4), so the matched worker spills at 9 in flight
    # (mean 4.5, margin 4.24; 8 is not over 4 + 4); the spilled request caches red on the
    # other worker, which then has the match and the lower load.
    reqs = [request(f"s{i}", T0 + i * 0.01, [RED], latency=5.0, ttft=0.001)
            for i in range(12)]
    out = run(reqs, Scenario("cache_aware", "router", workers=2))
    assert [i for i, b in enumerate(out.branch) if b == "spill"] == [9]
    assert len(set(out.worker[:9])) == 1 and set(out.worker[9:]) == {1 - out.worker[0]}
    # A threshold under 4 is the margin itself: 2 over the mean spills at 5 in flight.
    low = run(reqs, parse("policy=cache_aware,balance_abs_threshold=2", Scenario(workers=2)))
    assert low.branch.index("spill") == 5


def test_a_request_not_streamed_commits_its_prompt_before_its_decode_ends() -> None:
    # Not streamed (no TTFT): latency = 10 ms + 20 ms per output token in the recording, so
    # the 2.01 s request's prompt is cached after about 10 ms, and a repeat 0.2 s later hits.
    reqs = [request(f"t{i}", T0 + i, [BLUE], output=out, latency=0.01 + 0.02 * out, ttft=None)
            for i, out in enumerate((8, 16, 32))]
    reqs += [request("long", T0 + 10, [RED], output=100, latency=2.01, ttft=None),
             request("repeat", T0 + 10.2, [RED], output=8, latency=0.17, ttft=None)]
    out = run(reqs, Scenario("cache_aware", "router", workers=2))
    assert out.worker[3] == out.worker[4] and out.hit[4] == 5


def test_block_sizes_rekey_from_the_recorded_layout_or_are_refused() -> None:
    r = request("a", T0, [BIG])
    p16, p32 = prompt(r, 16), prompt(r, 32)
    assert p16 is not None and p32 is not None
    assert p32.content == p16.content[1::2] and len(p32.content) == p16.tokens // 32
    with pytest.raises(BlockSizeError):
        prompt(r, 24)
    reqs = _seq([BIG, BIG])
    assert _cached(Scenario("cache_aware", "router", block_size=64, workers=2), reqs)[1] == \
        (prompt(reqs[1], 64).tokens - 1) // 64 * 64


def test_simple_policies_and_a_bad_scenario() -> None:
    reqs = _seq([RED] * 6)
    rr = run(reqs, Scenario("round_robin", workers=3))
    assert rr.worker == [0, 1, 2, 0, 1, 2] and rr.hit[3] == 5 and rr.hit[1] == 0
    a = run(reqs, Scenario("random", workers=4, seed=7))
    b = run(reqs, Scenario("random", workers=4, seed=7))
    assert a.worker == b.worker
    keyed = run(reqs, parse("policy=consistent_hashing,routing_key=prefix",
                            Scenario(workers=4)))
    assert len(set(keyed.worker)) == 1 and keyed.branch[0] == "routing_key_hit"
    with pytest.raises(ScenarioError, match="no parameter"):
        parse("policy=dynamo,balance_abs_threshold=3", Scenario())
    with pytest.raises(ScenarioError):
        parse("policy=cache_aware,mode=sideways", Scenario())


def _captured(name: str) -> list[dict]:
    return json.loads((CAPTURES / f"{name}_observed_responses.json").read_text())


@pytest.mark.parametrize("capture,scenario", [
    ("smg_1.13", Scenario("cache_aware", "router", workers=2)),
    ("dynamo_1.6.1", Scenario("dynamo_kv", "exact", workers=2)),
])
def test_models_match_a_recorded_real_router_run(capture: str, scenario: Scenario) -> None:
    """tests/observed/capture.py sent red 64×64, red again, blue 224×224 (the same 64 image
    tokens), text only and red streamed, one after another, to the real router in front of
    two simulated vLLM workers; the model predicts what the engines reported."""
    images = {"red": [RED], "red-again": [RED], "blue": [BLUE], "text": [],
              "red-stream": [RED]}
    shots = _captured(capture)
    reqs = [request(s["name"], T0 + i, images[s["name"]]) for i, s in enumerate(shots)]
    real = [(s["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            for s in shots]
    assert [r.prompt_tokens for r in reqs] == [s["usage"]["prompt_tokens"] for s in shots]
    out = run(reqs, scenario)
    assert [h * 16 for h in out.hit] == real == [0, 80, 0, 0, 80]
    blue = [s["name"] for s in shots].index("blue")
    if capture.startswith("smg"):
        # SMG sent all four routed-worker-headed requests to one worker, blue included.
        workers = {s["headers"].get("x-smg-routed-worker-id") for s in shots[:4]}
        assert len(workers) == 1 and len(set(out.worker[:4])) == 1
        assert verdict_of(out, blue) == "false_hit"
    else:
        assert verdict_of(out, blue) == "cold"


def test_dynamo_lowest_cost_equals_the_full_scan() -> None:
    """The incremental cost (only the workers whose load changed are recosted, each class of
    equally credited workers costed from its cheapest) picks a worker of the full formula's
    lowest cost, over random loads, cached overlaps and requests in flight."""
    import random

    from mmlens.whatif.policies.base import Loads
    from mmlens.whatif.policies.dynamo import KvRouter

    rnd = random.Random(3)
    chains = [tuple(rnd.getrandbits(64) for _ in range(20)) for _ in range(4)]
    for _ in range(300):
        n = rnd.randint(1, 8)
        router = KvRouter(n, 16, seed=rnd.randint(0, 9))
        loads = Loads(n)
        for w in range(n):
            if rnd.random() < 0.5:
                router.stored(w, list(rnd.choice(chains)[:rnd.randint(1, 20)]), [], 0.0)
            for _ in range(rnd.randint(0, 2)):
                tokens = rnd.choice((15, 81, 300))
                loads.start(w, rnd.choice((0, 16, tokens)))
                keys = rnd.choice(chains)[:tokens // 16]
                router.routed(w, prompt_of(tokens), keys, 0.0)
        isl = rnd.choice((15, 81, 300))
        keys = rnd.choice(chains)[:isl // 16]
        chosen = router.choose(prompt_of(isl), keys, 0.0, loads)
        cached = router.index.overlaps(keys)
        shared = router.in_flight_index.overlaps(keys)
        assert chosen.predicted_blocks == cached.get(chosen.worker, 0)
        full = [router._cost(w, cached.get(w, 0), shared.get(w, 0), isl, loads)
                for w in range(n)]
        assert full[chosen.worker] == pytest.approx(min(full))


def prompt_of(tokens: int) -> Prompt:
    return Prompt(tokens, 0, (), (), (), None, True)
