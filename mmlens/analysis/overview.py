"""The overview page's content from a snapshot (``mmlens.store.snapshot.Snapshot``) and recent
traces: target health, headline numbers and alerts that name their cause."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mmlens.analysis.request_view import predicted_tokens
from mmlens.analysis.rollups import ROLLUP_SOURCE
from mmlens.records import CollectorHealth, RequestTrace, Verdict
from mmlens.shard import COLLECTOR as SHARD_COLLECTOR
from mmlens.shard import parse_label
from mmlens.state import Snapshot

EVENTS_STALE_S = 120.0
TARGET_STALE_S = 30.0
FALSE_HIT_SHARE = 0.05
# A load balancer spills now and then by design (SMG's worker mode, which cannot key images,
# places a repeat by load half the time): fewer spills than this are not worth an alert.
SPILL_MIN = 3
EXAMPLES = 6  # requests an alert links
# Collectors that succeed when something arrives (a KV batch, a request, a span) rather than
# on a schedule: silence past the stale age is an idle cluster, not a broken collector (a
# worker that served but announced nothing is alerted as ``kv_events_silent``).
EVENT_DRIVEN = frozenset({"kv_events", "kv_event_plane", "observed", "otlp", "tap"})
# Rows only worth a line when something went wrong (they never report a success).
QUIET_UNLESS_FAILING = frozenset({"discovery", "supervisor"})
# Hit rates the headline sums: the engines' own counters (per-minute rollups on a fleet).
ENGINE_SOURCES = frozenset({"vllm", "sglang", ROLLUP_SOURCE})


@dataclass(frozen=True, slots=True)
class Alert:
    severity: str  # error | warning | info
    cause: str
    message: str
    request_id: str | None = None  # an example request, for a link into the inspector
    examples: tuple[str, ...] = ()  # more of the requests behind it
    since: float | None = None  # when the condition began, when the data shows it


@dataclass(frozen=True, slots=True)
class Headline:
    engine_hit_rate: float | None
    engine_tokens: float
    predicted_hit_rate: float | None
    predicted_requests: int
    router_mode_share: float | None
    worker_mode_share: float | None
    image_requests: float


def _age(ts: float | None, now: float) -> float | None:
    return None if ts is None else max(0.0, now - ts)


def target_rows(snap: Snapshot, now: float) -> list[dict[str, Any]]:
    """One row per collector target: kind, last success age, errors, KV freshness."""
    rows = []
    for h in snap.health:
        if (h.collector in QUIET_UNLESS_FAILING and not h.errors) \
                or h.collector == SHARD_COLLECTOR:
            continue
        age = _age(h.last_success, now)
        if h.last_success is None:
            state = "no data yet" if not h.errors else "down"
        elif age is not None and age > (EVENTS_STALE_S if h.collector == "kv_events"
                                        else TARGET_STALE_S):
            state = "idle" if h.collector in EVENT_DRIVEN else "stale"
        else:
            state = "ok"
        if h.last_error_ts and (h.last_success or 0) < h.last_error_ts:
            state = "down"
        rows.append({"collector": h.collector, "target": h.target, "state": state,
                     "last success (s ago)": None if age is None else round(age, 1),
                     "errors": sum(h.errors.values()),
                     "last error": h.last_error or ""})
    return rows


def shard_rows(snap: Snapshot, now: float) -> list[dict[str, Any]]:
    """One row per collector shard (``mmlens collect --shard I/N``): its last tick and the
    workers, KV endpoints and events it owns."""
    newest: dict[str, CollectorHealth] = {}  # a restarted shard leaves its old process's row
    for h in snap.health:
        old = newest.get(h.target)
        if h.collector == SHARD_COLLECTOR and (
                old is None or (h.last_success or 0) > (old.last_success or 0)):
            newest[h.target] = h
    rows = []
    for h in newest.values():
        c = h.counters
        age = _age(h.last_success, now)
        rows.append({"shard": h.target,
                     "state": "ok" if age is not None and age <= TARGET_STALE_S else "stale",
                     "last tick (s ago)": None if age is None else round(age, 1),
                     "workers": int(c.get("workers", 0)),
                     "fleet workers": int(c.get("fleet_workers", 0)),
                     "KV endpoints": int(c.get("kv_endpoints", 0)),
                     "KV events stored": int(c.get("kv_events", 0)),
                     "store lag p99 (s)": c.get("store_lag_p99_s")})
    return sorted(rows, key=_shard_order)


def _shard_order(row: dict[str, Any]) -> tuple[int, int, str]:
    shard = parse_label(row["shard"])
    return (shard.count, shard.index, "") if shard else (0, 0, row["shard"])


def headline(snap: Snapshot, traces: Sequence[RequestTrace]) -> Headline:
    engines = [r for r in snap.metrics.hit_rates if r.source in ENGINE_SOURCES]
    hits = sum(r.hits_increase for r in engines)
    queries = sum(r.queries_increase for r in engines)
    if queries <= 0:  # no traffic in the window: fall back to the cumulative counters
        rates = [r.cumulative_rate for r in snap.metrics.hit_rates
                 if r.cumulative_rate is not None]
        engine = (sum(rates) / len(rates)) if rates else None
    else:
        engine = hits / queries
    pred_tokens = 0
    prompt_tokens = 0
    n_pred = 0
    for t in traces:
        p = predicted_tokens(t)
        if p is None or not t.prompt_tokens:
            continue
        n_pred += 1
        pred_tokens += min(p, t.prompt_tokens)
        prompt_tokens += t.prompt_tokens
    dyn = [d["predicted_hit_rate_mean"] for d in snap.metrics.dynamo.values()
           if d.get("predicted_hit_rate_mean") is not None]
    predicted = (pred_tokens / prompt_tokens if prompt_tokens else
                 (sum(dyn) / len(dyn) if dyn else None))
    modes: dict[str, float] = {}
    for row in snap.metrics.mm_processing:
        modes[row["mode"]] = modes.get(row["mode"], 0.0) + float(row["count"])
    total = sum(modes.values())
    return Headline(
        engine_hit_rate=engine, engine_tokens=queries, predicted_hit_rate=predicted,
        predicted_requests=n_pred,
        router_mode_share=modes.get("router", 0.0) / total if total else None,
        worker_mode_share=modes.get("worker", 0.0) / total if total else None,
        image_requests=total)


def alerts(snap: Snapshot, traces: Sequence[RequestTrace], now: float) -> list[Alert]:
    out: list[Alert] = []
    out += _kv_event_alerts(snap, traces, now)
    out += _false_hit_alerts(traces, snap.verdicts)
    out += _block_size_alerts(snap, traces)
    out += _fallback_alerts(snap, traces)
    out += _health_alerts(snap)
    out += _shard_alerts(snap, now)
    return out


def _shard_alerts(snap: Snapshot, now: float) -> list[Alert]:
    """A shard that never reported or stopped ticking leaves its workers uncollected."""
    rows = shard_rows(snap, now)
    seen: dict[int, set[int]] = {}
    for r in rows:
        shard = parse_label(r["shard"])
        if shard is not None:
            seen.setdefault(shard.count, set()).add(shard.index)
    out = []
    for count, indexes in sorted(seen.items()):
        missing = sorted(set(range(count)) - indexes)
        if missing:
            out.append(Alert("error", "shard_missing",
                             f"collector shard(s) {', '.join(f'{i}/{count}' for i in missing)} "
                             "never reported: their workers are not collected"))
    out += [Alert("error", "shard_stale",
                  f"collector shard {r['shard']} last ticked {r['last tick (s ago)']} s ago: "
                  f"its {r['workers']} workers are not collected") for r in rows
            if r["state"] == "stale"]
    return out


def _kv_event_alerts(snap: Snapshot, traces: Sequence[RequestTrace],
                     now: float) -> list[Alert]:
    out = []
    served: dict[str, float] = {}
    for t in traces:
        if t.worker and not t.error:
            served[t.worker] = max(served.get(t.worker, 0.0), t.ts or 0.0)
    for target, ep in snap.kv_endpoints.items():
        worker = target.rsplit("#", 1)[0]
        last = ep.last_success
        last_served = served.get(worker)
        # A worker that served nothing has nothing to announce: silence is only news after
        # it stored blocks (a request landed on it) and no batch followed.
        if last_served is not None and (last is None or last < last_served - 5.0):
            out.append(Alert("error", "kv_events_silent", (
                f"KV events silent for {target}: it served a request "
                f"{now - last_served:.0f} s ago but no event batch arrived "
                f"{'ever' if last is None else f'since {now - last:.0f} s ago'} — the "
                "router is blind to what this worker caches"), since=last_served))
        elif ep.gaps:
            out.append(Alert("warning", "kv_events_gaps", (
                f"{target}: {ep.gaps} sequence gap(s), {ep.replayed_batches} "
                "batch(es) replayed")))
    for target, h in snap.metrics.kv_event_health.items():
        for worker, w in (h.get("workers") or {}).items():
            if w.get("unavailable"):
                out.append(Alert("error", "kv_events_unavailable", (
                    f"{target} reports KV events unavailable for {worker}: cache-aware routing "
                    "runs without its events")))
            failures = sum((w.get("subscription_failures") or {}).values())
            if failures:
                out.append(Alert("warning", "kv_subscription_failures", (
                    f"{target}: {failures:.0f} KV-event subscription failure(s) for {worker}")))
    return out


def _false_hit_alerts(traces: Sequence[RequestTrace], verdicts: Mapping[str, Verdict],
                      ) -> list[Alert]:
    """False hits and spills over all traffic (mmlens' own and observed requests), from
    their stored verdicts: a request not judged yet, or whose realized hit is unknown or
    ambiguous, counts as neither."""
    judged = [(t, verdicts[t.request_id]) for t in traces if t.request_id in verdicts]
    known = [(t, j) for t, j in judged if j.category not in ("unknown", "error")
             and not j.category.startswith("hit_or_")]
    with_pred = sum(1 for t, j in known if j.predicted_blocks is not None
                    or predicted_tokens(t) is not None)
    false_hits = [(t, j) for t, j in known if j.category == "false_hit"]
    spills = [(t, j) for t, j in known if j.category == "spilled"]
    unknown = sum(1 for _, j in judged if j.category == "unknown"
                  or j.category.startswith("hit_or_"))
    observed = sum(1 for t, _ in false_hits if t.origin == "observed")
    out = []
    if false_hits and len(false_hits) >= FALSE_HIT_SHARE * max(with_pred, 1):
        ex, exj = false_hits[0]
        out.append(Alert("warning", "false_hits", (
            f"{len(false_hits)} of {with_pred} recent requests ({observed} not sent by "
            "mmlens): the router predicted cached blocks the engine did not have "
            f"(content-blind false hits), e.g. {ex.request_id}: {exj.headline}"
            + (f"; {unknown} more with the realized hit unknown" if unknown else "")),
            ex.request_id, tuple(t.request_id for t, _ in false_hits[1:EXAMPLES])))
    if len(spills) >= max(SPILL_MIN, FALSE_HIT_SHARE * len(known)):
        ex, exj = spills[0]
        out.append(Alert("info", "spills", (
            f"{len(spills)} of {len(known)} recent requests were spilled or load-balanced "
            f"away from the worker holding their prefix, e.g. {ex.request_id}: "
            f"{exj.headline}"), ex.request_id, tuple(t.request_id for t, _ in spills[1:EXAMPLES])))
    return out


def _block_size_alerts(snap: Snapshot, traces: Sequence[RequestTrace]) -> list[Alert]:
    sizes: dict[str, set[int]] = {}
    for state in snap.router_state or []:
        for w in state.get("workers") or []:
            if w.get("kv_block_size"):
                sizes.setdefault(f"worker {w['url']} (router /workers)", set()).add(
                    int(w["kv_block_size"]))
    for target, d in snap.metrics.dynamo.items():
        for model, bs in (d.get("block_size") or {}).items():
            sizes.setdefault(f"{target} {model} (Dynamo)", set()).add(int(bs))
    for t in traces[:50]:
        for p in t.predictions:
            if p.block_size:
                sizes.setdefault(f"router {t.router} (cache trace)", set()).add(p.block_size)
    distinct = {b for v in sizes.values() for b in v}
    if len(distinct) > 1:
        detail = "; ".join(f"{k}: {sorted(v)}" for k, v in sorted(sizes.items()))
        return [Alert("error", "block_size_mismatch", (
            f"router and worker block sizes differ ({detail}): block hashes cannot match"))]
    return []


def _fallback_alerts(snap: Snapshot, traces: Sequence[RequestTrace]) -> list[Alert]:
    out = []
    for target, branches in snap.metrics.cache_aware_branches.items():
        total = sum(branches.values())
        fallback = sum(v for k, v in branches.items() if "fallback" in k)
        if total and fallback / total > 0.25:
            out.append(Alert("warning", "fallbacks", (
                f"{target}: {fallback:.0f} of {total:.0f} cache-aware decisions fell back to "
                "load-based selection")))
    warned = [t for t in traces if any(p.warnings for p in t.predictions)]
    if warned:
        out.append(Alert("warning", "text_prefix_fallback", (
            f"{len(warned)} recent request(s) carry router warnings (text-prefix fallback or "
            f"skipped MM routing), e.g. {warned[0].request_id}"), warned[0].request_id,
            tuple(t.request_id for t in warned[1:EXAMPLES])))
    return out


def _health_alerts(snap: Snapshot) -> list[Alert]:
    out = []
    for state in snap.router_state or []:
        for w in state.get("workers") or []:
            if not w.get("healthy", True):
                status = w.get("status") or "unhealthy"
                out.append(Alert("error", "worker_unhealthy",
                                 f"{state.get('router')}: worker {w['url']} is {status}"))
    for row in snap.metrics.worker_health:
        if row.get("healthy") is False:
            out.append(Alert("error", "worker_unhealthy",
                             f"{row['target']} reports worker {row['worker']} unhealthy"))
    return out
