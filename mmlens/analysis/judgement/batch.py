"""Judging requests in batches over a window of KV events: the state the lead collector's
verdict job keeps between runs (each worker's chains and removals, what each worker held),
and one pass that attributes chains and judges the requests asked for. Pure: the job, the
benchmark and ``mmlens check`` feed it rows read from a store."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from mmlens.analysis.judgement.attribution import (
    SLACK_S,
    Served,
    WorkerChains,
    attribute,
    image_key,
)
from mmlens.analysis.judgement.evidence import Evidence, usage_realized
from mmlens.analysis.judgement.holdings import HeldIndex
from mmlens.analysis.judgement.order import (
    ahead_by_less_than,
    clocks_apart,
    closed,
    ended_by_order,
    exact_dispatch,
)
from mmlens.analysis.judgement.rules import judge
from mmlens.ingest.observed import known
from mmlens.records import RequestTrace, Verdict

EVICTION_WINDOW_S = 300.0
UNKNOWN_SPAN_S = 30.0  # a request without a latency may have run this long
# ts, unit, kind, parent, hashes[, the images' identities in the blocks]
KVRow = tuple[float, str, str, "str | None", list[str]] | tuple[
    float, str, str, "str | None", list[str], list[str]]


def unit_of(t: RequestTrace) -> str | None:
    """The cache a request used: its worker, or ``worker#rank`` beyond DP rank 0."""
    if not t.worker:
        return None
    return t.worker if not t.dp_rank else f"{t.worker}#{t.dp_rank}"


def dispatch_ts(t: RequestTrace) -> float:
    """When the router dispatched it: SMG's cache trace has nanoseconds, log lines seconds."""
    exact = [p.ts for p in t.predictions if p.ts is not None and p.source.endswith("cache_trace")]
    return min(exact) if exact else t.ts


def span_of(t: RequestTrace) -> tuple[float, float]:
    """Dispatch to the latest it can have ended. A stream's latency in SMG's log is the time
    to the response's head: its end is the bound its own completion line gives."""
    start = dispatch_ts(t)
    if t.stream and t.provenance.get("latency_s", "").endswith(":smg"):
        return start, max(start, t.ended_by) if t.ended_by is not None \
            else start + UNKNOWN_SPAN_S
    return start, start + (UNKNOWN_SPAN_S if t.latency_s is None else float(t.latency_s))


def block_size_of(t: RequestTrace) -> int:
    lay = t.expected_layout
    if lay is not None and lay.block_size:
        return int(lay.block_size)
    return next((p.block_size for p in t.predictions if p.block_size), 16)


def prompt_of(t: RequestTrace, block_size: int) -> int | None:
    """The engine's prompt length; else the router's count of it (SMG logs its expanded
    prompt and its approximate tree's input tokens); else the shortest the router's block
    count allows (SMG counts full blocks; Dynamo a last partial one too, which may be
    full: ``rounded_up``)."""
    return prompt_told(t, block_size)[0]


def prompt_told(t: RequestTrace, block_size: int) -> tuple[int | None, bool]:
    """``prompt_of``, and whether it is the shortest of a rounded-up block count."""
    if t.prompt_tokens and known(t, "prompt_tokens"):
        return int(t.prompt_tokens), False
    told = next((p.expanded_tokens for p in t.predictions if p.expanded_tokens), None) or \
        next((p.input_units for p in t.predictions if p.input_units
              and p.prediction_source == "approximate_tree"), None)
    if told:
        return int(told), False
    blocks = next((p.request_blocks for p in t.predictions if p.request_blocks is not None),
                  None)
    if blocks is None:
        return None, False
    up = t.router_kind == "dynamo" and blocks > 0
    return max(0, blocks - int(up)) * block_size + 1, up


def sizes_of(t: RequestTrace) -> tuple[tuple[int, int], ...] | None:
    """Its images' pixel sizes when the router logged every one (None: any unknown)."""
    if not t.images or not all(im.width and im.height for im in t.images):
        return None
    return tuple((int(im.width), int(im.height)) for im in t.images)  # type: ignore[arg-type]


def identities_of(t: RequestTrace) -> frozenset[str] | None:
    """Its images' identities when every image has one a source told (Dynamo's log names
    each image's hash; SMG's gives sizes only): None when any is unknown."""
    if not t.images:
        return None
    ids = [[v for v in im.identities.values() if v] for im in t.images]
    return frozenset(image_key(v) for vs in ids for v in vs) if all(ids) else None


TOUCH_GAP_S = 1.0


def _ranges(times: list[float]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for ts in sorted(times):
        if out and ts - out[-1][1] < TOUCH_GAP_S:
            out[-1] = (out[-1][0], ts)
        else:
            out.append((ts, ts))
    return out


PRUNE_STEP_S = 60.0  # chains are pruned once the cut moved this far (every read is recent)


@dataclass(frozen=True, slots=True)
class _Seen:
    """What attribution reads of one request, kept while its record stays the same object
    with the same decisions joined (the job keeps its window decoded between runs)."""

    trace: RequestTrace
    decisions: int
    unit: str | None
    served: Served | None
    identities: frozenset[str] | None


def _seen(t: RequestTrace) -> _Seen:
    u = unit_of(t)
    ids = identities_of(t)
    if u is None or t.failed:
        return _Seen(t, len(t.predictions), u, None, ids)
    start, end = span_of(t)
    bs = block_size_of(t)
    known = usage_realized(t, bs)
    # On the router's own host the engine's clock is the router's: its blocks are stored
    # after the exact dispatch, with no slack before it.
    exact = clocks_apart(u) == 0 and exact_dispatch(t) is not None
    prompt, up = prompt_told(t, bs)
    return _Seen(t, len(t.predictions), u, Served(
        t.request_id, start, end, prompt, bs, None if known is None else known.blocks, ids,
        stored_from=start if exact else None, one_more=up, sizes=sizes_of(t)), ids)


@dataclass
class JudgeState:
    horizon_s: float = 900.0
    chains: dict[str, WorkerChains] = field(default_factory=dict)
    held: HeldIndex = field(default_factory=HeldIndex)
    removals: dict[str, tuple[list[float], list[int]]] = field(default_factory=dict)
    seen: dict[int, _Seen] = field(default_factory=dict)  # id(trace) → what it gives
    pruned_to: float = float("-inf")

    def apply_kv(self, rows: Iterable[KVRow]) -> dict[str, list[tuple[float, float]]]:
        """Apply KV rows; per unit the time ranges they cover (rows less than
        ``TOUCH_GAP_S`` apart in one range): what late rows touch."""
        seen: dict[str, list[float]] = {}
        for row in rows:
            ts, unit, kind, parent, hashes = row[:5]
            chains = self.chains.get(unit)
            if chains is None:
                chains = self.chains[unit] = WorkerChains()
            if kind == "stored":
                chains.stored(ts, parent, hashes, row[5] if len(row) > 5 else ())
            elif kind == "removed":
                chains.removed(ts, hashes)
                times, sums = self.removals.setdefault(unit, ([], []))
                at = bisect.bisect_right(times, ts)
                times.insert(at, ts)
                sums.insert(at, len(hashes))
            else:
                chains.cleared(ts)
            seen.setdefault(unit, []).append(ts)
        return {unit: _ranges(ts_list) for unit, ts_list in seen.items()}

    def covered(self, unit: str, ts: float) -> None:
        """The collector had drained ``unit``'s KV stream by ``ts``: an idle worker's silence
        after its last event then says its requests stored nothing (a whole prompt cached);
        a batch that was missing after all arrives late and re-judges them."""
        chains = self.chains.get(unit)
        if chains is not None:
            chains.last_ts = max(chains.last_ts, ts)

    def removed_before(self, unit: str, ts: float) -> int:
        times, counts = self.removals.get(unit, ([], []))
        lo = bisect.bisect_left(times, ts - EVICTION_WINDOW_S)
        hi = bisect.bisect_right(times, ts)
        return sum(counts[lo:hi])

    def prune(self, before: float) -> None:
        step = before - self.pruned_to >= PRUNE_STEP_S
        for chains in self.chains.values():
            if step:
                chains.prune_segments(before)
            chains.cap()
        if step:
            self.pruned_to = before
        self.held.prune(before)
        for times, counts in self.removals.values():
            cut = bisect.bisect_left(times, before - EVICTION_WINDOW_S)
            del times[:cut], counts[:cut]

    def judge(self, context: Sequence[RequestTrace], todo: Iterable[str],
              blind: frozenset[str] = frozenset(), judged_at: float | None = None,
              ) -> list[Verdict]:
        """Judge the requests of ``todo`` (ids in ``context``), against every request of
        ``context`` (all that ran around them) for KV-chain attribution."""
        self.held.add(context)
        by_id = {t.request_id: t for t in context}
        wanted = [by_id[r] for r in dict.fromkeys(todo) if r in by_id]
        judging = {t.request_id for t in wanted}
        units = {u for t in wanted if (u := unit_of(t)) in self.chains}
        served: dict[str, list[Served]] = {}
        ended = ended_by_order(context)
        seen, self.seen = self.seen, {}
        known_ids: set[str] = set()
        for t in context:
            got = seen.get(id(t))
            if got is None or got.trace is not t or got.decisions != len(t.predictions):
                got = _seen(t)
            self.seen[id(t)] = got
            if got.identities:
                known_ids.update(got.identities)
            if got.served is not None and got.unit in units:
                served.setdefault(got.unit, []).append(got.served)
        known = frozenset(known_ids)
        realized = {}
        exact: dict[str, float] | None = None
        for u, rows in served.items():
            ordered = any(r.request_id in ended for r in rows)
            apart = clocks_apart(u)
            if ordered:
                rows = closed(rows, ended, apart)
            latest: dict[str, float] | None = {} if ordered and apart > 0 else None
            got = attribute(self.chains[u], rows, u, SLACK_S, known, judging, latest)
            if latest:
                if exact is None:
                    exact = {t.request_id: at for t in context
                             if (at := exact_dispatch(t)) is not None}
                ahead = ahead_by_less_than(latest, exact)
                if ahead is not None and ahead < apart:
                    got = attribute(self.chains[u], closed(rows, ended, ahead), u, SLACK_S,
                                    known, judging)
            realized.update(got)
        out = []
        for t in wanted:
            u = unit_of(t)
            held, seed = self.held.held(t)
            out.append(judge(Evidence(
                t, realized.get(t.request_id), held, "earlier requests' layouts" if held
                else None, seed, 0 if u is None else self.removed_before(u, dispatch_ts(t)),
                blind), judged_at))
        return out
