"""Prometheus metric families from what the store holds: the same answers ``mmlens snapshot``
prints (each request's stored verdict, the available-vs-achieved cells, the router-vs-engine block
comparisons, the collectors' health), as counters and gauges with bounded label sets.

Labels are routers, models, workers, verdicts, causes, collectors and their targets: never a
request id or an image hash, so the series count grows with the fleet, not with the traffic.

With shards (``mmlens collect --shard I/N``) each process exports its part: the rows of the
workers whose identity hashes to its shard (rows without a worker go to shard 0) and its own
health rows, so a ``sum`` over the shards' series is the whole store's answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.samples import Exemplar

from mmlens.analysis.availability.aggregate import FIDELITIES
from mmlens.analysis.availability.attribution import CAUSES
from mmlens.analysis.judgement.shown import PENDING, category
from mmlens.analysis.judgement.vocabulary import CATEGORIES
from mmlens.records import CollectorHealth, Verdict
from mmlens.shard import COLLECTOR as SHARD_COLLECTOR
from mmlens.shard import Shard, shard_of

CellRow = tuple[float, str, str, str, dict[str, int]]
"""A stored availability cell: (minute, router, model, worker, sums)."""
ViewRow = tuple[float, str, str, int | None, int | None, int, int]
"""A stored router-view comparison: (ts, worker, source, router blocks, engine blocks,
router only, engine only)."""

class Labelled(Protocol):
    """A request as the exporter labels it (a ``RequestTrace``, or the store's lighter
    ``TraceLabels``)."""

    request_id: str
    ts: float
    router: str
    model: str
    worker: str | None


REQUEST_LABELS = ("router", "model", "worker")
EXEMPLAR_MAX_CHARS = 128

# Availability sums → (metric name without _total, help). Every one is per router/model/worker.
CELL_COUNTERS = (
    ("n", "mmlens_evaluated_requests",
     "Requests evaluated for available vs achieved (their KV history and cached tokens known)"),
    ("prompt", "mmlens_evaluated_prompt_tokens",
     "Prompt tokens of the evaluated requests"),
    ("realized", "mmlens_realized_cached_tokens",
     "Prompt tokens the engine served from its prefix cache (evaluated requests)"),
    ("best", "mmlens_available_cached_tokens",
     "Prompt tokens the best worker held at the router's decision (evaluated requests)"),
    ("avoidable", "mmlens_avoidable_prefill_tokens",
     "Prefill tokens that were avoidable: available on the best worker, not realized"),
    ("false_hit", "mmlens_false_hit_tokens",
     "Tokens the router predicted cached that the engine did not hold (content-blind or "
     "stale)"),
    ("not_cacheable", "mmlens_not_cacheable_tokens",
     "Prompt tokens no worker could serve from cache (the block holding the last token)"),
    ("pred_blocks", "mmlens_predicted_cached_blocks",
     "Blocks the router predicted cached, over requests it predicted for"),
    ("pred_request_blocks", "mmlens_predicted_request_blocks",
     "Blocks of the requests the router predicted for"),
    ("pred_realized_blocks", "mmlens_predicted_realized_blocks",
     "Blocks the engine served from cache, over requests the router predicted for"),
)

# Collector health counters (monotonic per collector row) → metric, help.
HEALTH_COUNTERS = (
    ("gaps", "mmlens_kv_event_gaps", "KV-event sequence gaps seen (replayed or not)"),
    ("missed_batches", "mmlens_kv_event_missed_batches",
     "KV-event batches missing at a gap, before any replay"),
    ("replayed_batches", "mmlens_kv_event_replayed_batches",
     "KV-event batches fetched again from a publisher's replay socket"),
    ("duplicate_batches", "mmlens_kv_event_duplicate_batches",
     "KV-event batches received again (replays, reconnects)"),
    ("duplicate_events", "mmlens_kv_event_duplicate_events",
     "KV events already stored (idempotency key), not stored again"),
    ("stored_events", "mmlens_kv_events_stored", "KV events stored"),
)
LOST = "unrecovered_gap"  # the error kind of a gap given up on: its events are lost
HEALTH_GAUGES = (
    ("last_lag_s", "mmlens_collector_lag_seconds",
     "Publisher timestamp to receipt of the latest KV-event batch"),
)
SHARD_LAG = (("store_lag_p50_s", "0.5"), ("store_lag_p99_s", "0.99"))


@dataclass(frozen=True, slots=True)
class Part:
    """The rows one collector process exports (all of them without shards)."""

    shard: Shard | None = None

    @property
    def leads(self) -> bool:
        return self.shard is None or self.shard.leads

    def owns(self, worker: str | None) -> bool:
        if self.shard is None:
            return True
        if not worker:
            return self.shard.leads
        # A unit label is ``worker#rank``: every rank of a worker in the worker's shard.
        return shard_of(worker.split("#", 1)[0], self.shard.count) == self.shard.index


@dataclass
class ExportInputs:
    traces: Sequence[Labelled] = ()
    verdicts: Mapping[str, Verdict] = field(default_factory=dict)  # request id → stored
    cells: Sequence[CellRow] = ()
    views: Sequence[ViewRow] = ()  # the newest comparisons (the caller bounds the window)
    health: Sequence[CollectorHealth] = ()  # this process's rows
    shards: Sequence[CollectorHealth] = ()  # every shard's row, as the store has them
    part: Part = field(default_factory=Part)


def drift_tokens(v: Verdict | None) -> int:
    """Tokens by which the engine's prompt differs from what the router (or mmlens' layout)
    expected, as the stored count-drift verdict says; 0 otherwise."""
    if v is None or v.category != "count_drift":
        return 0
    return abs(int(v.evidence.get("difference") or 0))


def request_families(traces: Iterable[Labelled], verdicts: Mapping[str, Verdict],
                     part: Part) -> list[Metric]:
    """Requests by their stored verdict (``pending``: not judged yet), as ``mmlens snapshot``
    tallies them."""
    requests = CounterMetricFamily(
        "mmlens_requests", "Requests by router, model, serving worker and stored verdict "
        "(pending: not judged yet)", labels=(*REQUEST_LABELS, "verdict"))
    drift = CounterMetricFamily(
        "mmlens_count_drift_tokens", "Prompt tokens by which engines expanded requests to "
        "another length than the router (or mmlens' expected layout)", labels=REQUEST_LABELS)
    owned = [t for t in traces if part.owns(t.worker)]
    # Every (router, model) with every worker at 0 from the first request on: ``increase()``
    # then counts a worker's first false hit or drift (its series is not new when it happens).
    pairs = {(t.router, t.model) for t in owned}
    workers = {t.worker or "" for t in owned}
    by_drift = {(r, m, w): 0 for r, m in pairs for w in workers}
    by_verdict = {(*key, c): 0 for key in by_drift for c in (*CATEGORIES, PENDING)}
    # The newest request behind each series and what it added: the series' exemplar.
    newest: dict[tuple[str, ...], tuple[Labelled, int]] = {}
    for t in owned:
        v = verdicts.get(t.request_id)
        key = (t.router, t.model, t.worker or "")
        by_verdict[(*key, category(v))] += 1
        by_drift[key] += (tokens := drift_tokens(v))
        for series, added in (((*key, category(v)), 1), (key, tokens)):
            if added and (series not in newest or t.ts >= newest[series][0].ts):
                newest[series] = (t, added)
    for labels, n in sorted(by_verdict.items()):
        requests.add_metric(labels, n, exemplar=exemplar(newest.get(labels)))
    for labels, n in sorted(by_drift.items()):
        drift.add_metric(labels, n, exemplar=exemplar(newest.get(labels)))
    return [requests, drift]


def exemplar(found: tuple[Labelled, int] | None) -> Exemplar | None:
    """The newest request behind a series, as an OpenMetrics exemplar (``request_id``, which
    Grafana links to mmlens' Inspector); not a label, so the series count stays bounded.
    OpenMetrics caps an exemplar's labels at 128 characters."""
    if found is None or len("request_id") + len(found[0].request_id) > EXEMPLAR_MAX_CHARS:
        return None
    return Exemplar({"request_id": found[0].request_id}, float(found[1]), found[0].ts)


def availability_families(cells: Iterable[CellRow], part: Part) -> list[Metric]:
    """Every cell summed per router, model and worker (counters: the stored minutes only
    grow, until retention drops the oldest, which Prometheus reads as a counter reset)."""
    totals: dict[tuple[str, str, str], dict[str, int]] = {}
    for _, router, model, worker, sums in cells:
        if not part.owns(worker):
            continue
        acc = totals.setdefault((router, model, worker), {})
        for k, v in sums.items():
            acc[k] = acc.get(k, 0) + v
    out: list[Metric] = []
    for key, name, text in CELL_COUNTERS:
        fam = CounterMetricFamily(name, text, labels=REQUEST_LABELS)
        for labels, acc in sorted(totals.items()):
            fam.add_metric(labels, acc.get(key, 0))
        out.append(fam)
    causes = CounterMetricFamily(
        "mmlens_avoidable_prefill_tokens_by_cause", "Avoidable prefill tokens split by cause "
        "(load_spill, content_blind, stale_index, count_drift, unattributed, evicted, "
        "unexplained)", labels=(*REQUEST_LABELS, "cause"))
    fidelity = CounterMetricFamily(
        "mmlens_image_requests", "Evaluated image requests by how the router keyed their "
        "images (exact, degraded, text_prefix, unknown): image-routing fidelity",
        labels=(*REQUEST_LABELS, "fidelity"))
    for labels, acc in sorted(totals.items()):
        for c in CAUSES:
            causes.add_metric((*labels, c), acc.get(c, 0))
        for f in FIDELITIES:
            fidelity.add_metric((*labels, f), acc.get(f, 0))
    return [*out, causes, fidelity]


def view_families(views: Iterable[ViewRow], part: Part) -> list[Metric]:
    """The newest router-vs-engine comparison per worker and source, as gauges."""
    newest: dict[tuple[str, str], ViewRow] = {}
    for row in views:
        key = (row[1], row[2])
        if part.owns(row[1]) and (key not in newest or row[0] >= newest[key][0]):
            newest[key] = row
    labels = ("worker", "source")
    fams = [GaugeMetricFamily(name, text, labels=labels) for name, text in (
        ("mmlens_kv_router_blocks", "Blocks the router's index holds for the worker"),
        ("mmlens_kv_engine_blocks", "Blocks the worker's own KV events say it holds"),
        ("mmlens_kv_router_only_blocks",
         "Blocks the router believes resident that the engine does not hold"),
        ("mmlens_kv_engine_only_blocks",
         "Blocks the engine holds that the router's index does not know"))]
    for (worker, source), row in sorted(newest.items()):
        values = (row[3], row[4], row[5], row[6])
        for fam, v in zip(fams, values, strict=True):
            if v is not None:
                fam.add_metric((worker, source), v)
    return fams


def health_families(health: Sequence[CollectorHealth]) -> list[Metric]:
    labels = ("collector", "target")
    success = GaugeMetricFamily(
        "mmlens_collector_last_success_timestamp_seconds",
        "When the collector last succeeded for its target (Unix time)", labels=labels)
    written = GaugeMetricFamily(
        "mmlens_collector_last_write_timestamp_seconds",
        "When this collector process last wrote its health to the store (Unix time; every "
        "tick)", labels=())
    errors = CounterMetricFamily(
        "mmlens_collector_errors", "Collector errors by kind: parse errors (bad_json, "
        "malformed_exposition, truncated_frame, ...), unreachable targets, unrecovered gaps",
        labels=(*labels, "kind"))
    lost = CounterMetricFamily(
        "mmlens_kv_event_unrecovered_gaps", "KV-event gaps given up on (no replay): their "
        "events are lost", labels=labels)
    counters = [CounterMetricFamily(name, text, labels=labels)
                for _, name, text in HEALTH_COUNTERS]
    gauges = [GaugeMetricFamily(name, text, labels=labels) for _, name, text in HEALTH_GAUGES]
    for h in sorted(health, key=lambda h: (h.collector, h.target)):
        key = (h.collector, h.target)
        if h.last_success is not None:
            success.add_metric(key, h.last_success)
        for kind, n in sorted(h.errors.items()):
            errors.add_metric((*key, kind), n)
        if h.collector == "kv_events" or LOST in h.errors:
            lost.add_metric(key, h.errors.get(LOST, 0))
        for (counter, _, _), fam in zip(HEALTH_COUNTERS, counters, strict=True):
            if counter in h.counters:
                fam.add_metric(key, h.counters[counter])
        for (counter, _, _), fam in zip(HEALTH_GAUGES, gauges, strict=True):
            if counter in h.counters:
                fam.add_metric(key, h.counters[counter])
    stamps = [h.updated for h in health if h.updated is not None]
    if stamps:
        written.add_metric((), max(stamps))
    return [success, written, errors, lost, *counters, *gauges]


def shard_families(shards: Sequence[CollectorHealth]) -> list[Metric]:
    """Every shard's own row (the lead exports them: a shard that stopped writing is still
    seen when nobody scrapes it)."""
    tick = GaugeMetricFamily(
        "mmlens_shard_last_tick_timestamp_seconds",
        "When the shard last finished a collection tick (Unix time)", labels=("shard",))
    workers = GaugeMetricFamily("mmlens_shard_workers", "Workers the shard collects",
                                labels=("shard",))
    lag = GaugeMetricFamily(
        "mmlens_shard_store_lag_seconds", "Publisher timestamp to store commit of the shard's "
        "KV events, over its last window", labels=("shard", "quantile"))
    for h in sorted(shards, key=lambda h: h.target):
        if h.collector != SHARD_COLLECTOR:
            continue
        if h.last_success is not None:
            tick.add_metric((h.target,), h.last_success)
        if "workers" in h.counters:
            workers.add_metric((h.target,), h.counters["workers"])
        for counter, q in SHARD_LAG:
            if counter in h.counters:
                lag.add_metric((h.target, q), h.counters[counter])
    return [tick, workers, lag]


def families(inputs: ExportInputs) -> list[Metric]:
    part = inputs.part
    out = request_families(inputs.traces, inputs.verdicts, part)
    out += availability_families(inputs.cells, part)
    out += view_families(inputs.views, part)
    out += health_families(inputs.health)
    if part.leads:
        out += shard_families(inputs.shards)
    return out
