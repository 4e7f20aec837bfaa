"""A Lab sequence judged as an experiment: what it expects, whether the run met it (one PASS or
FAIL with its reason), a warning before sending images a content-blind router cannot tell
apart, and each first send framed as the seed it is."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from mmlens.analysis.lab_plan import StepResult

# A replay "found its cache" when more than this share of its prompt came from cache.
WARM_SHARE = 0.5
# Routers that key blocks by token ids alone: two images of one size expand to the same ids
# (SMG 1.13 ignores vLLM's extra_keys when routing).
CONTENT_BLIND = frozenset({"smg"})

EXPECTS = {
    "abab": "each replay returns to its seed's worker and finds more than half its prompt "
            "cached",
    "repeat": "every repeat after the first finds more than half its prompt cached",
    "isolation": "A's repeat is warm and B (other pixels) is not a hit",
    "staircase": "each step finds the previous step's blocks cached",
}


@dataclass(frozen=True, slots=True)
class Experiment:
    outcome: str  # pass | fail | inconclusive
    reason: str
    expects: str


def _pct(r: StepResult) -> str:
    return "failed" if r.error else (f"{r.hit:.0%} cached" if r.hit is not None else "cached ?")


def _warm(r: StepResult) -> bool:
    return r.hit is not None and r.hit > WARM_SHARE


def _predicted_missing(r: StepResult, block: int = 16) -> bool:
    """The router predicted more than a block of cache the engine did not find (measured from
    the step's own counts, so it holds before the collector's verdict is stored)."""
    return bool(r.predicted) and (r.predicted or 0) > (r.cached_tokens or 0) + block


def same_size_warning(sequence: str, sizes: Sequence[tuple[int, int]], count: int,
                      router_kind: str, mode: str | None) -> str | None:
    """Before sending: A and B of one size through a content-blind router in router mode
    expand to identical token ids, so the router cannot tell them apart."""
    if sequence not in ("abab", "isolation") or count < 2 or not sizes:
        return None
    a, b = sizes[0], sizes[1 % len(sizes)]
    if a != b or router_kind not in CONTENT_BLIND or mode == "worker":
        return None
    return (f"A and B are both {a[0]}x{a[1]}: {router_kind.upper()} routes on token ids, and "
            "two images of one size expand to the same ids, so it cannot tell A from B "
            "(content-blind). Expect B to be predicted as a hit it is not, and a replay may "
            "go to the other image's worker. Give two sizes (e.g. 480x360, 640x480) to see "
            "affinity work.")


def seed_notes(results: Sequence[StepResult]) -> dict[int, str]:
    """Per result (by index) that is the first send of its images to its router: it is the
    seed, and what the router predicted for it is explained."""
    seen: set[tuple[str, str]] = set()
    out: dict[int, str] = {}
    for i, r in enumerate(results):
        key = (r.router, r.key)
        if key in seen:
            continue
        seen.add(key)
        if r.error:
            continue
        name = r.key.split("+")[0] if r.key else r.step
        if _predicted_missing(r):
            out[i] = (f"seed: first send of {r.key}; the router predicted {r.predicted} cached "
                      f"tokens on {r.worker} from an earlier image of the same size (same token "
                      "ids, other pixels), and the engine found "
                      f"{r.cached_tokens or 0}: a true content-blind false hit, expected here")
        elif r.cached_tokens:
            out[i] = (f"seed: first send of {r.key}; {r.cached_tokens} tokens were already "
                      f"cached on {r.worker} (the shared text before {name}, or an earlier run)")
        else:
            out[i] = f"seed: first send of {r.key}; nothing cached yet, as expected"
    return out


def judge_experiment(sequence: str, results: Sequence[StepResult],
                     same_size: bool = False, content_blind: bool = False) -> Experiment:
    """The run against what its sequence expects, per router; the first router that fails
    gives the reason. ``same_size``/``content_blind`` name the cause of an ABAB failure."""
    expects = EXPECTS.get(sequence, "")
    if not expects or not results:
        return Experiment("inconclusive", "nothing to judge: this run expects nothing", expects)
    by_router: dict[str, list[StepResult]] = {}
    for r in results:
        by_router.setdefault(r.router, []).append(r)
    multi = len(by_router) > 1
    for router, rs in by_router.items():
        failed = next((r for r in rs if r.error), None)
        if failed is not None:
            return Experiment("fail", f"{failed.step} failed: {failed.error}", expects)
        why = _judge(sequence, rs, same_size, content_blind)
        if why is not None:
            return Experiment("fail", (f"{router}: " if multi else "") + why, expects)
    return Experiment("pass", _pass_reason(sequence, results), expects)


def _judge(sequence: str, rs: Sequence[StepResult], same_size: bool,
           content_blind: bool) -> str | None:
    """Why one router's steps fail the sequence, or None when they pass."""
    if sequence == "abab":
        return _judge_abab(rs, same_size and content_blind)
    if sequence == "repeat":
        cold = next((r for r in rs[1:] if not _warm(r)), None)
        return None if cold is None else (
            f"{cold.step} found only {_pct(cold)} on {cold.worker}")
    if sequence == "isolation":
        warm, other = (rs[1], rs[2]) if len(rs) >= 3 else (None, None)
        if warm is None or other is None:
            return "the run has fewer steps than the sequence"
        if not _warm(warm):
            return f"{warm.step} found only {_pct(warm)} on {warm.worker}"
        if _warm(other) and (other.cached_tokens or 0) > (warm.cached_tokens or 0) / 2:
            return (f"{other.step} was served {other.cached_tokens} cached tokens: another "
                    "image's cache reused for different pixels")
        return None
    if sequence == "staircase":
        for prev, r in pairwise(rs):
            if (r.cached_tokens or 0) < (prev.prompt_tokens or 0) // 2:
                return (f"{r.step} found {r.cached_tokens or 0} cached tokens; "
                        f"{prev.step} had left {prev.prompt_tokens or 0}")
        return None
    return None


BY_POSITION = ("SMG routes same-size images by position, not content (A and B expand to the "
               "same token ids)")


def _judge_abab(rs: Sequence[StepResult], blind: bool) -> str | None:
    """Two images sent together, then each again: the seeds spread over two workers (the
    router sees both in flight) unless it believed one worker already held the second; each
    replay returns to its seed's worker and is warm."""
    seeds: dict[str, StepResult] = {}
    cause = f": {BY_POSITION}" if blind else ""
    for r in rs:
        if r.key not in seeds:
            first = next(iter(seeds.values()), None)
            if first is not None and first.worker == r.worker and _predicted_missing(r):
                return (f"{r.step} went to {r.worker}, {first.step}'s worker: the router "
                        f"predicted {r.predicted} cached tokens there and the engine found "
                        f"{r.cached_tokens or 0}" + cause)
            seeds[r.key] = r
            continue
        seed = seeds[r.key]
        other = next((s for k, s in seeds.items() if k != r.key), None)
        if r.worker != seed.worker:
            whose = (f", {other.step}'s worker" if other is not None
                     and other.worker == r.worker else "")
            return (f"{r.step} went to {r.worker}{whose}, not {seed.worker} where {seed.step} "
                    f"was seeded ({_pct(r)})" + cause)
        if not _warm(r):
            return (f"{r.step} returned to {r.worker} but found only {_pct(r)}: its seed's "
                    "blocks were not reused")
    return None


def _pass_reason(sequence: str, results: Sequence[StepResult]) -> str:
    replays = [r for r in results if "again" in r.step
               or (r.step.startswith("repeat ") and not r.step.endswith(" 1"))]
    if sequence == "abab":
        return ("every replay went back to its seed's worker and was warm: " + ", ".join(
            f"{r.step} → {r.worker} {_pct(r)}" for r in replays))
    if sequence == "repeat":
        return "every repeat was warm: " + ", ".join(f"{r.step} {_pct(r)}" for r in replays)
    return EXPECTS[sequence]
