"""``Owners`` answers as every assignment, enumerated, does: who may own which segment (one
question, or all of a request's at once) and who may own none, on random small groups of
requests and segments (some segments optional)."""

from __future__ import annotations

import itertools
import random

from mmlens.analysis.judgement.ownership import Owners


def _assignments(cands: dict[str, list[str]], required: set[str]) -> list[dict[str, str]]:
    """Every matching (request → one of its segments, or none) that owns every required
    segment."""
    rids = list(cands)
    out = []
    for pick in itertools.product(*[[None, *dict.fromkeys(cands[r])] for r in rids]):
        owned = [s for s in pick if s is not None]
        if len(owned) == len(set(owned)) and required <= set(owned):
            out.append({r: s for r, s in zip(rids, pick, strict=True) if s is not None})
    return out


def _groups(cands: dict[str, list[str]]) -> list[set[str]]:
    """The requests linked through shared segments."""
    groups: list[set[str]] = []
    for rid, segs in cands.items():
        linked = [g for g in groups if any(set(segs) & set(cands[o]) for o in g)]
        merged = {rid}.union(*linked)
        groups = [g for g in groups if g not in linked] + [merged]
    return groups


def _expected(cands: dict[str, list[str]], optional: set[str],
              ) -> tuple[dict[tuple[str, str], bool], dict[str, bool]]:
    """By enumeration, group by group; a group no assignment covers forces nothing."""
    own: dict[tuple[str, str], bool] = {}
    none: dict[str, bool] = {}
    for group in _groups(cands):
        sub = {r: cands[r] for r in group}
        required = {s for r in group for s in cands[r]} - optional
        every = _assignments(sub, required)
        for r in group:
            none[r] = not every or any(r not in a for a in every)
            for s in cands[r]:
                own[r, s] = not every or any(
                    a.get(r) == s or (s in optional and r not in a) for a in every)
    return own, none


def test_owners_answers_as_the_enumerated_assignments() -> None:
    rng = random.Random(5)
    for case in range(1500):
        segs = [f"s{i}" for i in range(rng.randint(1, 5))]
        cands = {f"r{i}": rng.sample(segs, rng.randint(0, len(segs)))
                 for i in range(rng.randint(1, 5))}
        optional = {s for s in segs if rng.random() < 0.2}
        owners = Owners(cands, frozenset(optional))
        own, none = _expected(cands, optional)
        for rid in cands:
            assert owners.may_own_none(rid) == none[rid], (case, cands, optional, rid)
            for s in cands[rid]:
                assert owners.may_own(rid, s) == own[rid, s], (case, cands, optional, rid, s)
            assert owners.owned_by(rid, cands[rid]) == [s for s in cands[rid] if own[rid, s]]
        assert not owners.may_own("r0", "nobody's")


def test_a_cycle_of_owners_lets_each_own_either() -> None:
    # Two segments only two requests can own: each may own either, neither none; a third
    # request of their length owns none.
    owners = Owners({"a": ["x", "y"], "b": ["x", "y"], "c": ["x", "y", "z"]},
                    frozenset({"z"}))
    assert owners.may_own("a", "y") and owners.may_own("b", "x")
    assert owners.may_own_none("a") and owners.may_own("c", "z")
    tight = Owners({"a": ["x", "y"], "b": ["x", "y"]})
    assert tight.may_own("a", "x") and tight.may_own("a", "y")
    assert not tight.may_own_none("a") and not tight.may_own_none("b")
