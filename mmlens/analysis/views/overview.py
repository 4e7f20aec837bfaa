"""The Overview page's view: whether there is data, the headline, alerts and target tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mmlens.analysis.overview import Alert, Headline, alerts, headline, shard_rows, target_rows
from mmlens.state import Snapshot


@dataclass(slots=True)
class OverviewView:
    has_data: bool
    headline: Headline | None = None
    alerts: list[Alert] = field(default_factory=list)
    targets: list[dict[str, Any]] = field(default_factory=list)
    shards: list[dict[str, Any]] = field(default_factory=list)
    router_workers: list[dict[str, Any]] = field(default_factory=list)
    routers_down: list[str] = field(default_factory=list)
    prometheus: str | None = None
    store_notes: list[tuple[str, str]] = field(default_factory=list)  # (severity, text)


def router_workers(snap: Snapshot) -> list[dict[str, Any]]:
    """Workers as each router lists them (SMG ``/workers``)."""
    return [{"router": s.get("router"), "worker": w["url"], "healthy": w["healthy"],
             "status": w["status"], "load": w["load"], "kv_block_size": w["kv_block_size"],
             "mm_processor": w.get("mm_processor") or "—"}
            for s in snap.router_state or [] for w in s.get("workers") or []]


def routers_down(snap: Snapshot) -> list[str]:
    """SMG routers whose ``/workers`` did not answer."""
    return [s["router"] for s in snap.router_state or []
            if not s.get("workers") and s.get("kind") == "smg"]


def store_notes(snap: Snapshot) -> list[tuple[str, str]]:
    """Banners from the store's health rows: an outage the collectors buffer through (what they
    hold, what they had to drop), the last one survived, records refused as unreadable."""
    notes: list[tuple[str, str]] = []
    for h in snap.health:
        if h.collector != "store":
            continue
        c, who = h.counters, h.instance or "a collector"
        if h.target == "outage":
            held, dropped = int(c.get("backlog_records", 0)), int(c.get("dropped_records", 0))
            if c.get("down") or held:
                notes.append(("error", f"The store was unreachable for {who}: {held} records "
                              f"held ({int(c.get('spilled_backlog_records', 0))} spilled to a "
                              f"local file), written as soon as it answers. {h.last_error}"))
            elif c.get("outages"):
                notes.append(("info", f"{who} buffered through {int(c['outages'])} store "
                              f"outage(s), the last for {c.get('last_outage_s', 0):.0f} s: "
                              f"{int(c.get('retried_records', 0))} records written late."))
            if dropped:
                notes.append(("error", f"{dropped} records could not be held through a store "
                              f"outage and were dropped by {who}: {h.last_error}"))
        elif h.errors:
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(h.errors.items()))
            notes.append(("warning", f"Records set aside because they would not read back "
                          f"({kinds}): `mmlens snapshot --json` names them under "
                          "`quarantined`."))
    return notes


def log_notes(snap: Snapshot) -> list[tuple[str, str]]:
    """Banners from the log followers' health rows: a log the collector is behind on (what
    its last tick left unread), lines a stream follower had to drop."""
    notes: list[tuple[str, str]] = []
    for h in snap.health:
        if h.collector not in ("router_logs", "worker_logs"):
            continue
        behind = int(h.counters.get("backlog_bytes", 0) or 0)
        if behind:
            notes.append(("warning", f"The collector is behind on the log `{h.target}`: "
                          f"{behind / 1e6:,.1f} MB not read yet at its last tick (it reads on "
                          "without waiting; requests there show up late)."))
        dropped = int(h.errors.get("lines_dropped", 0) or 0)
        if dropped:
            notes.append(("error", f"{dropped:,} lines of the log `{h.target}` were dropped: "
                          "they came faster than the collector read them from its stream."))
    return notes


def overview_view(snap: Snapshot, more_alerts: list[Alert], now: float) -> OverviewView:
    if not snap.health and not snap.traces:
        return OverviewView(has_data=False)
    return OverviewView(
        has_data=True, headline=headline(snap, snap.traces),
        alerts=alerts(snap, snap.traces, now) + more_alerts,
        targets=target_rows(snap, now), shards=shard_rows(snap, now),
        router_workers=router_workers(snap), routers_down=routers_down(snap),
        prometheus=(snap.targets or {}).get("prometheus"),
        store_notes=store_notes(snap) + log_notes(snap))


def mark_routers_down(rows: Sequence[dict[str, Any]], down: Sequence[str],
                      ) -> list[dict[str, Any]]:
    """Liveness rows of a router that no longer answers say so (its last scrape listed the
    worker live, which no longer tells anything)."""
    return [{**r, "state": "router down"} if r.get("router") in down else dict(r)
            for r in rows]
