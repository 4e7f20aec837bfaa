"""Where a KV-event publisher's sequence stands, and what a new batch number means.

A vLLM/SGLang publisher numbers its batches 0, 1, 2, … and starts again at 0 when the worker
restarts; it keeps its last ``buffer_steps`` batches for replay. So, per (worker, DP rank):
- the next number in line is ``ok``; a jump ahead is a ``gap`` (replay the missing ones);
- a number at or below the last one is a ``restart`` (the old stream is over: everything
  after the new 0 is new, even numbers we already saw from the old incarnation);
- after the subscriber reconnected, a number ahead may still come from a restarted publisher
  that got past our last number while we were away: ``resync`` (replay the whole buffer and
  compare the batch times at our last number, see ``same_incarnation``).
Pure bookkeeping: the collector does the replay and the socket work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Verdict = Literal["first", "ok", "gap", "restart", "resync"]


@dataclass(slots=True)
class StreamState:
    last_seq: int | None = None
    last_ts: float | None = None  # batch time of last_seq: tells incarnations apart
    high: int = -1  # highest seq of the current incarnation
    earlier: int = 0  # batches numbered by earlier incarnations
    received: int = 0  # distinct batches applied, over all incarnations
    restarts: int = 0
    reconnected: bool = False

    @property
    def published(self) -> int:
        """Batches the publisher numbered (seen or not), over every incarnation we saw."""
        return self.earlier + self.high + 1

    @property
    def lost(self) -> int:
        return max(0, self.published - self.received)

    def classify(self, seq: int) -> Verdict:
        if self.last_seq is None:
            return "first"
        if seq <= self.last_seq:
            return "restart"
        if self.reconnected:
            return "resync"
        return "ok" if seq == self.last_seq + 1 else "gap"

    def restart(self) -> None:
        """The publisher started over: what follows is numbered from 0 again."""
        self.earlier += self.high + 1
        self.high = -1
        self.last_seq = self.last_ts = None
        self.restarts += 1
        self.reconnected = False

    def skip_to(self, seq: int) -> None:
        """Batches up to ``seq`` are given up (replay could not return them)."""
        if self.last_seq is None or seq > self.last_seq:
            self.last_seq, self.last_ts = seq, None
            self.high = max(self.high, seq)
        self.reconnected = False

    def late_applied(self) -> None:
        """A batch given up for the live stream came after all (``kv_owed``): received,
        while the stream stays where it is."""
        self.received += 1

    def applied(self, seq: int, ts: float | None) -> None:
        self.last_seq, self.last_ts = seq, ts
        self.high = max(self.high, seq)
        self.received += 1
        self.reconnected = False


def same_incarnation(state: StreamState, replayed: dict[int, float | None]) -> bool:
    """After a reconnect: does the publisher's buffer (seq → batch time) continue our stream?

    Yes when it holds our last batch with the same time, or starts beyond it (the buffer
    rolled over; a restart cannot be told apart then, so the missing batches are a gap);
    no when our last number carries another time or the buffer ends before it.
    """
    if state.last_seq is None:
        return False
    if state.last_seq in replayed:
        return replayed[state.last_seq] == state.last_ts
    return bool(replayed) and min(replayed) > state.last_seq
