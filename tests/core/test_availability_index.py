"""The resident-key index answers as a replay of its stores and removals would: every unit's
held prefix of a request, now and rewound to an earlier time."""

import random
from itertools import takewhile

import pytest

from mmlens.analysis.availability.index import ResidentKeys


def replayed(ops, at):
    held: dict[str, set[int]] = {}
    for ts, kind, unit, keys in ops:
        if ts > at:
            break
        if kind == "add":
            held.setdefault(unit, set()).update(keys)
        elif unit in held:
            held[unit].difference_update(keys)
    return held


def prefix(held, keys):
    return len(list(takewhile(held.__contains__, keys)))


@pytest.mark.parametrize("seed", range(8))
def test_overlaps_match_a_replay_now_and_rewound(seed):
    rng = random.Random(seed)
    units = [f"w{i}" for i in range(rng.choice([3, 20, 70]))]  # 70: past one machine word
    request = list(range(1000, 1040))
    index, ops = ResidentKeys(horizon_s=1e9), []
    for step in range(600):
        unit = rng.choice(units)
        keys = (request[:rng.randrange(41)] if rng.random() < 0.6
                else [*rng.sample(request, rng.randrange(1, 5)), rng.randrange(10**6)])
        kind = "add" if rng.random() < 0.7 else "remove"
        (index.add if kind == "add" else index.remove)(float(step), unit, keys)
        ops.append((float(step), kind, unit, keys))
    for at in [None, *(rng.uniform(0, 600) for _ in range(10))]:
        truth = replayed(ops, float("inf") if at is None else at)
        want = {u: n for u, s in truth.items() if (n := prefix(s, request))}
        assert index.overlaps(request, at) == want
        some = rng.sample(units, 3)
        assert index.overlaps(request, at, units=some) == {
            u: n for u, n in want.items() if u in some}
    now = replayed(ops, float("inf"))
    assert index.resident_blocks() == {u: len(now.get(u, ())) for u in index.resident_blocks()}
    assert {u: s for u, s in index.units.items() if s} == {u: s for u, s in now.items() if s}


def test_clear_drops_only_that_units_keys():
    index = ResidentKeys(horizon_s=0)
    index.add(1.0, "a", [1, 2, 3])
    index.add(1.0, "b", [1, 2])
    index.clear(2.0, "a")
    assert index.overlaps([1, 2, 3]) == {"b": 2}
    assert index.resident_blocks() == {"a": 0, "b": 2}
