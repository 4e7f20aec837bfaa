"""Batches a KV-event stream is still owed: ranges whose replay timed out without an answer.

A replay socket that is silent for a while (a busy worker, a restarted replay thread, a
network blip) and answers later still holds those batches in its buffer, so the collector
keeps the range and asks again later instead of declaring it lost. Pure bookkeeping; the
collector does the socket work (``mmlens.collectors.kv_late``).

A range is given up only when
- the publisher's answer starts after it (its buffer rolled over: ``rolled_over``);
- a batch bordering it came back with another batch time (the publisher restarted since:
  another incarnation, ``restart``);
- the ledger is over its budget (ranges, batches), oldest first (``budget``), or answers kept
  leaving it out (``unanswered``);
- the collector stops with it still owed (``stop``).
Each range remembers the batch times of its neighbours (``seq - 1`` and ``last + 1``, which
the stream applied): an answer whose neighbour batch has the same time is the same
incarnation, so its batches in the range are ours.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

GiveUpReason = str  # rolled_over | restart | budget | unanswered | stop

MAX_RANGES = 256
MAX_BATCHES = 10_000  # vLLM's and SGLang's default replay buffer (buffer_steps)
MAX_ANSWERS = 8  # answers that left a range out before it is given up


@dataclass(slots=True)
class OwedRange:
    first: int
    last: int  # inclusive
    kind: str  # the replay purpose that left it owed (gap, hole, restart, resync, join)
    answers: int = 0  # answers that did not return it

    @property
    def size(self) -> int:
        return self.last - self.first + 1


@dataclass(slots=True)
class Settled:
    """What one replay answer did to the ledger."""

    recovered: list[tuple[int, bytes]] = field(default_factory=list)  # in seq order
    given_up: list[tuple[OwedRange, GiveUpReason]] = field(default_factory=list)


class OwedLedger:
    def __init__(self, max_ranges: int = MAX_RANGES, max_batches: int = MAX_BATCHES,
                 max_answers: int = MAX_ANSWERS) -> None:
        self.max_ranges = max_ranges
        self.max_batches = max_batches
        self.max_answers = max_answers
        self.ranges: list[OwedRange] = []  # disjoint, in seq order
        self.anchors: dict[int, float | None] = {}  # batch times of the ranges' neighbours
        self.total = 0  # owed batches
        self._wanted: set[int] = set()  # the ranges' neighbours

    def __bool__(self) -> bool:
        return bool(self.ranges)

    @property
    def start(self) -> int:
        """Where a replay must start to return every owed batch and the first's neighbour."""
        return max(0, self.ranges[0].first - 1)

    def owe(self, first: int, last: int, kind: str, times: dict[int, float | None],
            ) -> list[tuple[OwedRange, GiveUpReason]]:
        """Owe ``first..last``; ``times`` holds batch times the stream knows (its neighbours
        among them, if applied already; ``note`` adds them later). Returns what the budget
        made it give up: the oldest part of a range longer than the budget, the oldest
        ranges beyond it."""
        if last < first:
            return []
        given_up: list[tuple[OwedRange, GiveUpReason]] = []
        if last - first >= self.max_batches:  # its newest part is the likeliest still held
            given_up.append((OwedRange(first, last - self.max_batches, kind), "budget"))
            first = last - self.max_batches + 1
        self.ranges.append(OwedRange(first, last, kind))
        self.ranges.sort(key=lambda r: r.first)
        for seq in (first - 1, last + 1):
            if seq in times:
                self.anchors[seq] = times[seq]
        while len(self.ranges) > self.max_ranges or sum(
                r.size for r in self.ranges) > self.max_batches:
            given_up.append((self.ranges.pop(0), "budget"))
        self._changed()
        return given_up

    def note(self, seq: int, ts: float | None) -> None:
        """A batch the stream applied: kept when it borders an owed range."""
        if seq in self._wanted:
            self.anchors[seq] = ts

    def give_up_all(self, reason: GiveUpReason) -> list[tuple[OwedRange, GiveUpReason]]:
        out = [(r, reason) for r in self.ranges]
        self.ranges = []
        self._changed()
        return out

    def settle(self, got: dict[int, bytes], complete: bool,
               ts_of: Callable[[bytes], float | None]) -> Settled:
        """Take a replay's answer (``got``: seq → payload, ``complete``: its end marker came).

        Replies come in buffer order from the requested start, so the lowest number in the
        answer is where the publisher's buffer begins."""
        out = Settled()
        if not self.ranges or (not got and not complete):
            return out
        for seq, ts in self.anchors.items():
            other = ts_of(got[seq]) if seq in got else None
            if other is not None and ts is not None and other != ts:
                out.given_up = self.give_up_all("restart")
                return out
        buffer_start = min(got) if got else None
        end = max(got) if got else -1
        keep: list[OwedRange] = []
        for r in self.ranges:
            if buffer_start is None or buffer_start > r.last:
                out.given_up.append((r, "rolled_over"))  # nothing of it is held any more
                continue
            if buffer_start > r.first:
                out.given_up.append((OwedRange(r.first, buffer_start - 1, r.kind),
                                     "rolled_over"))
                r.first = buffer_start
            if self._verified(r, got, ts_of):
                keep += self._fill(r, got, ts_of, out)
            else:
                r.answers += r.first <= end  # an answer that ended before it says nothing
                keep.append(r)
        self.ranges = []
        for r in keep:
            if r.answers >= self.max_answers:
                out.given_up.append((r, "unanswered"))
            else:
                self.ranges.append(r)
        self._changed()
        return out

    def _verified(self, r: OwedRange, got: dict[int, bytes],
                  ts_of: Callable[[bytes], float | None]) -> bool:
        """The answer holds a neighbour of the range with the batch time we applied."""
        for seq in (r.first - 1, r.last + 1):
            ts = self.anchors.get(seq)
            if ts is not None and seq in got and ts_of(got[seq]) == ts:
                return True
        return False

    def _fill(self, r: OwedRange, got: dict[int, bytes],
              ts_of: Callable[[bytes], float | None], out: Settled) -> list[OwedRange]:
        """Recover the range's batches in the answer; the holes left stay owed."""
        left: list[OwedRange] = []
        hole: int | None = None
        for seq in range(r.first, r.last + 2):
            if seq <= r.last and seq not in got:
                hole = seq if hole is None else hole
                continue
            if hole is not None:
                left.append(OwedRange(hole, seq - 1, r.kind, r.answers + 1))
                hole = None
            if seq <= r.last:
                out.recovered.append((seq, got[seq]))
                self.anchors[seq] = ts_of(got[seq])  # a neighbour of a hole, maybe
        return left

    def _changed(self) -> None:
        self.total = sum(r.size for r in self.ranges)
        self._wanted = {s for r in self.ranges for s in (r.first - 1, r.last + 1)}
        self.anchors = {s: t for s, t in self.anchors.items() if s in self._wanted}
