"""Alerts as states over time, one per cause: pending while a condition has held for less
than its cause's hold time (since first seen, or since the data shows it began), firing after,
resolved once a firing condition cleared (kept in view a few minutes, then dropped). A pending
condition that clears is dropped unseen: two views that race by a few seconds raise nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from mmlens.analysis.overview import Alert

AlertState = Literal["pending", "firing", "resolved"]
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
STATE_ORDER = {"firing": 0, "pending": 1, "resolved": 2}
# How long a condition must hold before it fires (Grafana's "for"). A judged request (a false
# hit, a fallback warning) is a fact and fires at once; comparisons of two views fed by
# different transports, and counters read between scrapes, must persist first.
HOLD_S: Mapping[str, float] = {"kv_view_divergence": 30.0, "kv_events_gaps": 15.0,
                               "kv_subscription_failures": 15.0, "fallbacks": 30.0,
                               "worker_gone": 10.0, "kv_events_silent": 10.0}
RESOLVED_KEEP_S = 300.0


@dataclass(frozen=True, slots=True)
class AlertGroup:
    """Every alert of one cause (e.g. one divergence line per worker), at its worst
    severity."""

    cause: str
    severity: str
    alerts: tuple[Alert, ...]

    @property
    def request_ids(self) -> list[str]:
        """The requests behind it, examples first, each once."""
        out: list[str] = []
        for a in self.alerts:
            for rid in (a.request_id, *a.examples):
                if rid and rid not in out:
                    out.append(rid)
        return out


@dataclass(frozen=True, slots=True)
class TrackedAlert:
    group: AlertGroup
    state: AlertState
    since: float  # pending or firing: when the condition started; resolved: when it cleared
    hold_s: float


def group_alerts(alerts: Sequence[Alert]) -> list[AlertGroup]:
    """One group per cause, worst severity first, then in the order the causes came."""
    by: dict[str, list[Alert]] = {}
    for a in alerts:
        by.setdefault(a.cause, []).append(a)
    groups = [AlertGroup(cause, min((a.severity for a in items),
                                    key=lambda s: SEVERITY_ORDER.get(s, 9)), tuple(items))
              for cause, items in by.items()]
    return sorted(groups, key=lambda g: SEVERITY_ORDER.get(g.severity, 9))


class AlertTracker:
    """Remembers when each cause started and cleared; ``update`` with the alerts found now."""

    def __init__(self, hold_s: Mapping[str, float] = HOLD_S,
                 keep_s: float = RESOLVED_KEEP_S) -> None:
        self.hold_s, self.keep_s = hold_s, keep_s
        self._started: dict[str, float] = {}
        self._fired: dict[str, AlertGroup] = {}  # firing causes, their latest group
        self._resolved: dict[str, tuple[AlertGroup, float]] = {}

    def update(self, alerts: Sequence[Alert], now: float) -> list[TrackedAlert]:
        groups = {g.cause: g for g in group_alerts(alerts)}
        out: list[TrackedAlert] = []
        for cause in list(self._started):
            if cause not in groups:
                del self._started[cause]
                fired = self._fired.pop(cause, None)
                if fired is not None:
                    self._resolved[cause] = (fired, now)
        for cause, g in groups.items():
            shown = [a.since for a in g.alerts if a.since is not None]
            started = min([self._started.get(cause, now), *shown])
            self._started[cause] = started
            self._resolved.pop(cause, None)
            hold = self.hold_s.get(cause, 0.0)
            if now - started >= hold:
                self._fired[cause] = g
                out.append(TrackedAlert(g, "firing", started, hold))
            else:
                out.append(TrackedAlert(g, "pending", started, hold))
        for cause, (g, cleared) in list(self._resolved.items()):
            if now - cleared > self.keep_s:
                del self._resolved[cause]
            else:
                out.append(TrackedAlert(g, "resolved", cleared, self.hold_s.get(cause, 0.0)))
        # Worst first; among equals, those that link requests (a way into an explanation).
        return sorted(out, key=lambda t: (STATE_ORDER[t.state],
                                          SEVERITY_ORDER.get(t.group.severity, 9),
                                          not t.group.request_ids))


def counts(tracked: Sequence[TrackedAlert]) -> dict[str, int]:
    out = dict.fromkeys(STATE_ORDER, 0)
    for t in tracked:
        out[t.state] += 1
    return out
