"""Judging requests in batches over a window of KV events: the state the lead collector's
verdict job keeps between runs (each worker's chains and removals, what each worker held),
and one pass that attributes chains and judges the requests asked for. Pure: the job, the
benchmark and ``mmlens check`` feed it rows read from a store."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from mmlens.analysis.judgement.attempts import failed_runs
from mmlens.analysis.judgement.attribution import (
    SLACK_S,
    Served,
    WorkerChains,
    attribute,
    image_key,
    runs_span,
)
from mmlens.analysis.judgement.engines import announces_all
from mmlens.analysis.judgement.evidence import Evidence, Realized, usage_realized
from mmlens.analysis.judgement.holdings import HeldIndex, keys_of
from mmlens.analysis.judgement.lengths import dynamo_prompt
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
# ts, unit, kind, parent, hashes[, the images' identities in the blocks[, where a prompt
# ended in a one-block store]]
KVRow = tuple[float, str, str, "str | None", list[str]] | tuple[
    float, str, str, "str | None", list[str], list[str]] | tuple[
    float, str, str, "str | None", list[str], list[str], "int | None"]


def unit_of(t: RequestTrace) -> str | None:
    """The cache a request used: its worker, or ``worker#rank`` beyond DP rank 0."""
    if not t.worker:
        return None
    return t.worker if not t.dp_rank else f"{t.worker}#{t.dp_rank}"


def dispatch_ts(t: RequestTrace) -> float:
    """When the router dispatched it: SMG's cache trace has nanoseconds, log lines seconds."""
    first = None
    for p in t.predictions:
        if p.ts is not None and p.source.endswith("cache_trace") and (first is None
                                                                     or p.ts < first):
            first = p.ts
    return t.ts if first is None else first


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
    for p in t.predictions:
        if p.block_size:
            return p.block_size
    return 16


def prompt_of(t: RequestTrace, block_size: int) -> int | None:
    """The engine's prompt length; else the router's count of it (SMG logs its expanded
    prompt and its approximate tree's input tokens); else the shortest the router's block
    count allows (SMG counts full blocks; Dynamo a last partial one too, which may be
    full: ``rounded_up``)."""
    return prompt_told(t, block_size)[0]


def prompt_told(t: RequestTrace, block_size: int) -> tuple[int | None, bool, bool]:
    """``prompt_of``; whether it is the shortest of a rounded-up block count; whether it is
    an approximate tree's units (SMG's: their full blocks need not be the engine's)."""
    return _told(t, block_size)[:3]


def length_exact(t: RequestTrace) -> bool:
    """Whether ``prompt_of`` is the engine's exact prompt length (the engine's count, SMG's
    expanded prompt, or Dynamo's input tokens with its images' counts), not the shortest a
    block count or a tree's units allow."""
    return _told(t, 1)[3]


def _told(t: RequestTrace, block_size: int) -> tuple[int | None, bool, bool, bool]:
    """``prompt_told`` and ``length_exact`` at once: the one place that says which source
    of a prompt's length is believed, and how far."""
    if t.prompt_tokens and known(t, "prompt_tokens"):
        return int(t.prompt_tokens), False, False, True
    exact = next((p.expanded_tokens for p in t.predictions if p.expanded_tokens), None) or \
        dynamo_prompt(t)
    if exact:
        return int(exact), False, False, True
    told = next((p.input_units for p in t.predictions if p.input_units
                 and p.prediction_source == "approximate_tree"), None)
    if told:
        return int(told), False, True, False
    blocks = next((p.request_blocks for p in t.predictions if p.request_blocks is not None),
                  None)
    if blocks is None:
        return None, False, False, False
    up = t.router_kind == "dynamo" and blocks > 0
    return max(0, blocks - int(up)) * block_size + 1, up, False, False


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


SIZE_ROUNDS = 4  # attributions of a judging while image sizes learned settle more
PRUNE_STEP_S = 60.0  # chains are pruned once the cut moved this far (every read is recent)


# Not frozen (one per request read; a frozen one costs three times as much to build):
# never changed once built.
@dataclass(slots=True)
class _Seen:
    """What attribution reads of one request, kept while its record stays the same object
    with the same decisions joined (the job keeps its window decoded between runs)."""

    trace: RequestTrace
    decisions: int
    unit: str | None
    served: Served | None
    identities: frozenset[str] | None
    # Its failed attempts' runs (unit, run): rivals for the blocks stored there, not judged.
    rivals: tuple[tuple[str, Served], ...] = ()


RIVAL = "#failed-attempt"  # a failed attempt's run is named its request id and this


def _rivals(t: RequestTrace, end: float, bs: int, ids: frozenset[str] | None,
            ) -> tuple[tuple[str, Served], ...]:
    preds = t.predictions
    if (len(preds) == 1 and preds[0].attempt is None) or all(p.attempt is None for p in preds):
        return ()  # one attempt (most requests): no failed run
    runs = failed_runs(t, end)
    if not runs:
        return ()
    prompt, up, approx = prompt_told(t, bs)
    sizes, seen = sizes_of(t), set()
    out = []
    for worker, start, stop in runs:
        if worker not in seen:  # its earliest on a unit: one run per unit
            seen.add(worker)
            out.append((worker, Served(t.request_id + RIVAL, start, stop, prompt, bs,
                                       None, ids, one_more=up, sizes=sizes, approx=approx)))
    return tuple(out)


def _seen(t: RequestTrace) -> _Seen:
    u = unit_of(t)
    ids = identities_of(t)
    if u is None or t.failed:
        rivals = () if not t.failed else _rivals(t, span_of(t)[1], block_size_of(t), ids)
        return _Seen(t, len(t.predictions), u, None, ids, rivals)
    start, end = span_of(t)
    bs = block_size_of(t)
    known = usage_realized(t, bs)
    # On the router's own host the engine's clock is the router's: its blocks are stored
    # after the exact dispatch, with no slack before it. Where the worker's own log says
    # when the request reached it, that is on the engine's clock wherever it runs.
    received = t.engine_received.get(u.split("#", 1)[0]) if t.engine_received else None
    if clocks_apart(u) == 0 and exact_dispatch(t) is not None:
        received = start if received is None else max(start, received)
    prompt, up, approx, exact = _told(t, bs)
    rivals = _rivals(t, end, bs, ids)
    return _Seen(t, len(t.predictions), u, Served(  # positional: one per request, and hot
        t.request_id, start, end, prompt, bs, None if known is None else known.blocks, ids,
        None, received, up, sizes_of(t), exact, approx), ids,
        tuple((w, r) for w, r in rivals if w != u) if rivals else ())


_Key = tuple[float, int]  # a request's place in a context: its start, then its row
_Every = Callable[[], Sequence[Served]]


@dataclass(slots=True)
class _Runs:
    """One unit's runs in a ``Context``: in the context's order, and by start (the order
    ``attribution`` links overlapping runs in)."""

    keys: list[_Key] = field(default_factory=list)
    served: dict[_Key, Served] = field(default_factory=dict)
    starts: list[tuple[float, _Key]] = field(default_factory=list)
    longest: float = 0.0  # the longest run ever added: how far a run before can reach

    def add(self, key: _Key, r: Served) -> None:
        bisect.insort(self.keys, key)
        self.served[key] = r
        bisect.insort(self.starts, (r.start, key))
        self.longest = max(self.longest, r.end - r.start)

    def remove(self, key: _Key) -> None:
        r = self.served.pop(key)
        del self.keys[bisect.bisect_left(self.keys, key)]
        del self.starts[bisect.bisect_left(self.starts, (r.start, key))]

    def everyone(self) -> list[Served]:
        return [self.served[k] for k in self.keys]

    def near(self, wanted: Collection[_Key], slack_s: float) -> list[Served]:
        """What ``attribution._overlapping`` keeps of all the runs for the requests at
        ``wanted``: the groups of runs overlapping (directly or through others) one of
        theirs, in the context's order. Groups are found from a start before the earliest
        of ``wanted`` that no run before can reach past (no run is longer than
        ``longest``): the work follows the runs near them, not all."""
        starts, served = self.starts, self.served
        marks = sorted(bisect.bisect_left(starts, (served[k].start, k))
                       for k in wanted if k in served)
        if not marks:
            return []
        first, n = marks[0], len(starts)
        reach_back = self.longest + 2 * slack_s + 1e-3
        back = reach_back
        while True:
            lo = bisect.bisect_left(starts, (starts[first][0] - back,))
            group = [0] * (n - lo)  # the index its group starts at, per run from ``lo``
            head, reach = lo, float("-inf")
            for at in range(lo, n):
                r = served[starts[at][1]]
                if at > lo and r.start - slack_s > reach:
                    head, reach = at, r.end + slack_s
                else:
                    reach = max(reach, r.end + slack_s)
                group[at - lo] = head
            # The group of the first wanted run starts where it does for all runs when no
            # run before ``lo`` can reach it; else look further back.
            g = group[first - lo]
            if lo == 0 or starts[g][0] - starts[lo][0] > reach_back:
                break
            back *= 2
        heads = {group[m - lo] for m in marks}
        keep = sorted(starts[at][1] for at in range(lo, n) if group[at - lo] in heads)
        return [served[k] for k in keep]


@dataclass(slots=True)
class _Entry:
    key: _Key
    trace: RequestTrace
    seen: _Seen | None = None  # read at the next judging (its decisions joined by then)


@dataclass
class Context:
    """The requests judging reads around the judged ones (the verdict job's decoded
    window), kept between calls to ``JudgeState.judge_context`` and changed request by
    request: what attribution reads of each, every unit's runs in order and by start, the
    image identities told, and the few requests whose layout, log order or exact dispatch
    the judgement reads. A request's record must not change once judged against: put it
    again (a fresh decode)."""

    entries: dict[int, _Entry] = field(default_factory=dict)
    fresh: dict[int, None] = field(default_factory=dict)  # put since the last indexing
    runs: dict[str, _Runs] = field(default_factory=dict)
    ids: dict[str, list[int]] = field(default_factory=dict)  # request id → rows
    identities: Counter[str] = field(default_factory=Counter)
    specials: dict[int, None] = field(default_factory=dict)
    _known: frozenset[str] | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def put(self, row: int, t: RequestTrace) -> None:
        """``t`` at ``row`` (its place: by start, then row), replacing what was there."""
        if row in self.entries:
            self.drop(row)
        self.entries[row] = _Entry((t.ts, row), t)
        self.fresh[row] = None
        self.ids.setdefault(t.request_id, []).append(row)

    def drop(self, row: int) -> None:
        e = self.entries.pop(row)
        rows = self.ids[e.trace.request_id]
        rows.remove(row)
        if not rows:
            del self.ids[e.trace.request_id]
        self.fresh.pop(row, None)
        if e.seen is None:  # not read yet
            return
        if e.seen.identities:
            for k in e.seen.identities:
                self.identities[k] -= 1
                if not self.identities[k]:
                    del self.identities[k]
            self._known = None
        if e.seen.served is not None and e.seen.unit is not None:
            self.runs[e.seen.unit].remove(e.key)
        for unit, _ in e.seen.rivals:
            self.runs[unit].remove(e.key)
        self.specials.pop(row, None)

    def index(self) -> None:
        """Read the requests put since the last call."""
        for row in self.fresh:
            e = self.entries[row]
            t = e.trace
            got = e.seen = _seen(t)
            if got.identities:
                self.identities.update(got.identities)
                self._known = None
            for unit, served in ((got.unit, got.served), *got.rivals):
                if served is not None and unit is not None:
                    runs = self.runs.get(unit)
                    if runs is None:
                        runs = self.runs[unit] = _Runs()
                    runs.add(e.key, served)
            if keys_of(t) or t.sent_seq is not None or t.ended_seq is not None or \
                    exact_dispatch(t) is not None:
                self.specials[row] = None
        self.fresh.clear()

    def entry(self, rid: str) -> _Entry | None:
        """The request of that id (the last in order, as a dict of the context by id)."""
        rows = self.ids.get(rid)
        return None if not rows else max((self.entries[r] for r in rows), key=_key_of)

    def special(self) -> list[RequestTrace]:
        """The requests with a layout, a log line's place or an exact dispatch, in order."""
        return [e.trace for e in sorted((self.entries[r] for r in self.specials), key=_key_of)]

    def known(self) -> frozenset[str]:
        if self._known is None:
            self._known = frozenset(self.identities)
        return self._known

    def on_unit(self, rid: str, unit: str) -> bool:
        """Whether a run of that id is among ``unit``'s."""
        return any((got := self.entries[r].seen) is not None and got.served is not None
                   and got.unit == unit for r in self.ids.get(rid, ()))


def _key_of(e: _Entry) -> _Key:
    return e.key


@dataclass
class JudgeState:
    horizon_s: float = 900.0
    chains: dict[str, WorkerChains] = field(default_factory=dict)
    held: HeldIndex = field(default_factory=HeldIndex)
    removals: dict[str, tuple[list[float], list[int]]] = field(default_factory=dict)
    seen: dict[int, _Seen] = field(default_factory=dict)  # id(trace) → what it gives
    pruned_to: float = float("-inf")
    # the workers whose engine announces every block it computes (``engines``)
    announcing: frozenset[str] = frozenset()
    # image key → pixel size, learned from requests whose only reading owns its chain
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)

    def apply_kv(self, rows: Iterable[KVRow]) -> dict[str, list[tuple[float, float]]]:
        """Apply KV rows; per unit the time ranges they cover (rows less than
        ``TOUCH_GAP_S`` apart in one range): what late rows touch."""
        seen: dict[str, list[float]] = {}
        every = self.chains
        for row in rows:
            if len(row) == 5:
                ts, unit, kind, parent, hashes = row  # type: ignore[misc]
                images: Sequence[str] = ()
            else:
                ts, unit, kind, parent, hashes = row[:5]
                images = row[5] if len(row) > 5 else ()  # type: ignore[misc]
            chains = every.get(unit)
            if chains is None:
                chains = every[unit] = WorkerChains()
            if kind == "stored":
                chains.stored(ts, parent, hashes, images,
                              row[6] if len(row) > 6 else None)  # type: ignore[misc]
            elif kind == "removed":
                chains.removed(ts, hashes)
                times, sums = self.removals.setdefault(unit, ([], []))
                at = bisect.bisect_right(times, ts)
                times.insert(at, ts)
                sums.insert(at, len(hashes))
            else:
                chains.cleared(ts)
            times_of = seen.get(unit)
            if times_of is None:
                times_of = seen[unit] = []
            times_of.append(ts)
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
            for unit, rival in got.rivals:
                if unit in units:
                    served.setdefault(unit, []).append(rival)
        realized = self._attribute(
            {u: (rows, None) for u, rows in served.items()}, context, frozenset(known_ids),
            judging)
        return self._verdicts(wanted, realized, blind, judged_at)

    def judge_context(self, ctx: Context, todo: Iterable[str],
                      blind: frozenset[str] = frozenset(), judged_at: float | None = None,
                      ) -> list[Verdict]:
        """``judge`` against every request of ``ctx`` (in its order), kept between calls:
        the same verdicts, but the work grows with the requests judged and the runs they
        overlap, not with the context."""
        ctx.index()
        special = ctx.special()
        self.held.add(special)
        entries = [e for r in dict.fromkeys(todo) if (e := ctx.entry(r)) is not None]
        wanted = [e.trace for e in entries]
        judging = {t.request_id for t in wanted}
        at: dict[str, list[_Key]] = {}
        for e in entries:
            if e.seen is not None and e.seen.unit in self.chains:
                at.setdefault(e.seen.unit, []).append(e.key)
        served: dict[str, tuple[Sequence[Served], _Every | None]] = {}
        for u in sorted(at):
            runs = ctx.runs.get(u)
            if runs is not None and runs.starts:
                served[u] = (runs.near(at[u], SLACK_S), runs.everyone)
        realized = self._attribute(served, special, ctx.known(), judging, ctx.on_unit)
        return self._verdicts(wanted, realized, blind, judged_at)

    def _attribute(self, served: Mapping[str, tuple[Sequence[Served], _Every | None]],
                   context: Sequence[RequestTrace],
                   known: frozenset[str], judging: set[str],
                   on_unit: Callable[[str, str], bool] | None = None,
                   ) -> dict[str, Realized]:
        """Per unit, attribution of its runs (``served``: those linked to the judged ones,
        and how to list every run of the context, None: they are all) to the requests of
        ``judging``.
        ``context``: every request whose log order or exact dispatch is known (at least).
        ``on_unit``: whether a request of that id ran on that unit (default: among its
        runs). Image sizes one unit's runs teach may settle another's (an image has one
        identity on every worker): the units are attributed again while they teach more."""
        ended = ended_by_order(context)
        for _ in range(SIZE_ROUNDS):
            before = len(self.sizes)
            realized = self._attribute_units(served, context, known, judging, on_unit, ended)
            if len(self.sizes) == before:
                break
        return realized

    def _attribute_units(self, served: Mapping[str, tuple[Sequence[Served], _Every | None]],
                         context: Sequence[RequestTrace], known: frozenset[str],
                         judging: set[str], on_unit: Callable[[str, str], bool] | None,
                         ended: Mapping[str, float]) -> dict[str, Realized]:
        realized: dict[str, Realized] = {}
        exact: dict[str, float] | None = None
        for u, (rows, every) in served.items():
            if on_unit is not None:
                ordered = any(on_unit(rid, u) for rid in ended)
            else:
                ordered = any(r.request_id in ended for r in rows)
            apart = clocks_apart(u)
            if ordered:
                rows = closed(rows, ended, apart)
            latest: dict[str, float] | None = {} if ordered and apart > 0 else None
            every_block = announces_all(self.announcing, u)
            got = attribute(self.chains[u], rows, u, SLACK_S, known, judging, latest,
                            _span(rows, every, ended, apart if ordered else None, known),
                            every_block, self.sizes)
            if self._learn_sizes(u, rows, every, got, known, every_block):
                latest = {} if latest is not None else None
                got = attribute(self.chains[u], rows, u, SLACK_S, known, judging, latest,
                                _span(rows, every, ended, apart if ordered else None, known),
                                every_block, self.sizes)
            if latest:
                if exact is None:
                    exact = {t.request_id: at for t in context
                             if (at := exact_dispatch(t)) is not None}
                ahead = ahead_by_less_than(latest, exact)
                if ahead is not None and ahead < apart:
                    again = closed(rows, ended, ahead)
                    got = attribute(self.chains[u], again, u, SLACK_S, known, judging,
                                    span=_span(again, every, ended, ahead, known),
                                    announces_all=every_block, sizes=self.sizes)
            realized.update(got)
        return realized

    def _learn_sizes(self, u: str, rows: Sequence[Served], every: _Every | None,
                     got: Mapping[str, Realized], known: frozenset[str],
                     every_block: bool) -> bool:
        """Where a judged request of logged image sizes keeps two readings, the sizes all
        of the unit's runs teach (the requests around, later ones too, that own one image's
        chain in their only reading): whether they taught one not known before."""
        sized = {r.request_id for r in rows if r.sizes}
        if not any(v.alternatives and rid in sized for rid, v in got.items()):
            return False
        before = len(self.sizes)
        attribute(self.chains[u], rows if every is None else every(), u, SLACK_S, known,
                  announces_all=every_block, sizes=self.sizes)
        return len(self.sizes) > before

    def _verdicts(self, wanted: Sequence[RequestTrace], realized: Mapping[str, Realized],
                  blind: frozenset[str], judged_at: float | None) -> list[Verdict]:
        out = []
        removals, index = self.removals, self.held
        for t in wanted:
            # nothing held anywhere (no layouts) or removed: neither asked of each request
            held, seed = index.held(t) if index.workers else ({}, None)
            u = unit_of(t) if removals else None
            out.append(judge(Evidence(
                t, realized.get(t.request_id), held, "earlier requests' layouts" if held
                else None, seed, 0 if u is None or u not in removals
                else self.removed_before(u, dispatch_ts(t)), blind), judged_at))
        return out


def _span(rows: Sequence[Served], every: _Every | None, ended: Mapping[str, float],
          ahead: float | None, known: frozenset[str]) -> tuple[float, float] | None:
    """The times all of a unit's runs cover (``attribution.runs_span``) when ``rows`` are
    not all of them and attribution needs it (images known); else None."""
    if every is None or not known or not any(r.images for r in rows):
        return None
    runs = every()
    return runs_span(runs if ahead is None else closed(runs, ended, ahead), SLACK_S)
