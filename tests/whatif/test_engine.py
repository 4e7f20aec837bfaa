"""The engine cache model against the demo engines' own block pool (mmlens.demo.prefix_cache,
the cache the demo's workers run), caching a prompt once its prefill ran as the model does
(the demo's vLLM caches it when it allocates it: requests that overlap hit more there): the
same requests admitted, committed after
their prefill, decoded and released in the same order must hit the same blocks, under
random traffic with shared prefixes and repeated prompts (answered alike) and a cache small
enough to evict (pinned blocks of running requests, decoded blocks cached and shared by
equal answers, tail-first release)."""

from __future__ import annotations

import heapq
import random

import pytest
from mmlens.demo.prefix_cache import PrefixCache

from mmlens.whatif.engine import EngineCache

BS = 4


def _keys(tokens: list[int]) -> tuple[int, ...]:
    """Chained keys of the full blocks (what the stored layouts give the model)."""
    out, h = [], 0
    for s in range(0, len(tokens) - BS + 1, BS):
        h = hash((h, tuple(tokens[s:s + BS]))) & ((1 << 62) - 1)
        out.append(h)
    return tuple(out)


def _identity(tokens: list[int]) -> int:
    return hash(tuple(tokens)) & ((1 << 62) - 1)


def _answer(tokens: list[int], n: int) -> list[int]:
    """A deterministic engine's answer: the same prompt, the same tokens (a shorter answer
    is a prefix of a longer one)."""
    rnd = random.Random(_identity(tokens))
    return [1000 + rnd.randrange(1000) for _ in range(n)]


def _trial(seed: int, capacity: int, alike: bool) -> tuple[list[int], list[int], int]:
    """With ``alike`` equal prompts get equal answers; else every answer is its own (the
    model told so: ``answer=None``)."""
    rnd = random.Random(seed)
    pool = [[rnd.randrange(50) for _ in range(rnd.randint(1, 40))] for _ in range(8)]
    real = PrefixCache(block_size=BS, num_blocks=capacity, stores_at_allocation=False)
    model = EngineCache(0, capacity)
    events: list = []
    due: list[tuple[float, int, int]] = []
    running = {}
    running_tokens: dict[int, list[int]] = {}
    real_hits, model_hits = [], []
    t = 0.0
    for i in range(60):
        t += rnd.expovariate(1.0)
        while due and due[0][0] <= t:
            _, kind, j = heapq.heappop(due)
            ra, ma, output = running[j]
            if kind == 0:  # prefill done: cache the prompt, then decode
                real.commit(ra, events)
                answer = (_answer(running_tokens[j], output) if alike
                          else [10_000 + 100 * j + k for k in range(output)])
                for tok in answer:
                    real.extend(ra, [tok], events)
                model.commit(ma)
            else:
                real.release(ra)
                model.release(ma)
        tokens = rnd.choice(pool) + [rnd.randrange(50) for _ in range(rnd.randint(0, 6))]
        output = rnd.randint(0, 10)
        ra = real.allocate(tokens, [], events)
        keys = _keys(tokens)
        ma = model.admit(keys, keys, len(tokens), output, BS,
                         answer=_identity(tokens) if alike else None)
        running_tokens[i] = tokens
        real_hits.append(ra.hit_blocks)
        model_hits.append(ma.hit_blocks)
        running[i] = (ra, ma, output)
        heapq.heappush(due, (t + rnd.uniform(0.05, 0.4), 0, i))
        heapq.heappush(due, (t + rnd.uniform(0.5, 2.5), 1, i))
    return real_hits, model_hits, model.evictions


@pytest.mark.parametrize("alike", [True, False], ids=["equal-answers", "own-answers"])
def test_the_model_hits_what_the_demo_engines_block_pool_hits(alike: bool) -> None:
    compared = evicted = 0
    for seed in range(120):
        try:
            real, model, evictions = _trial(seed, 48, alike)
        except MemoryError:  # every block pinned: the engine would wait, the model does not
            continue
        assert model == real, seed
        compared += 1
        evicted += evictions > 0
    assert compared >= 90 and evicted >= compared // 2, (compared, evicted)
