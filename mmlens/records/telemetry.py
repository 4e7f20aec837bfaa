"""What targets report as they are: metric samples, a router's worker list and loads,
OpenTelemetry spans; and the collectors' own health rows."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

Labels = tuple[tuple[str, str], ...]
"""Label pairs sorted by name; hashable so a series can be a dict key."""

Flavor = Literal["smg", "dynamo_frontend", "dynamo_worker", "vllm", "sglang", "unknown"]


def labels_of(mapping: dict[str, str]) -> Labels:
    return tuple(sorted(mapping.items()))


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One exposition sample (``name`` includes ``_total``/``_bucket``/``_sum`` suffixes)."""

    target: str
    name: str
    labels: Labels
    value: float
    ts: float

    def label(self, key: str, default: str = "") -> str:
        for k, v in self.labels:
            if k == key:
                return v
        return default


# --- Router state ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RouterWorker:
    """A worker as a router lists it (SMG ``/workers``)."""

    url: str
    model: str
    connection_mode: str
    runtime: str
    healthy: bool
    status: str
    load: int
    kv_block_size: int | None
    mm_processor: str | None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    worker: str
    dp_rank: int
    running: int
    waiting: int
    token_usage: float
    cache_hit_rate: float | None


# --- OpenTelemetry spans ---------------------------------------------------------------------


@dataclass(slots=True)
class SpanRecord:
    """One span as an OTLP exporter sent it (ids as lowercase hex, times in Unix ns)."""

    trace_id: str
    span_id: str
    name: str
    start_ns: int
    end_ns: int
    service: str = ""
    scope: str = ""
    parent_span_id: str | None = None
    kind: int = 0  # OTLP SpanKind: 1 internal, 2 server, 3 client
    attributes: dict[str, Any] = field(default_factory=dict)
    status_code: int = 0  # 0 unset, 1 ok, 2 error
    status_message: str = ""
    resource: dict[str, Any] = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)


@dataclass(slots=True)
class SpanEvent:
    """A span event; Dynamo exports each log line inside a span as one (name = message)."""

    name: str
    ts_ns: int = 0
    attributes: dict[str, Any] = field(default_factory=dict)


# --- Collector health ----------------------------------------------------------------------


QUARANTINE_KEEP = 20  # the latest bad items named per health row


class ErrorCounts(dict[str, int]):
    """Errors counted by kind (a plain dict to whoever reads or stores it), with the latest
    quarantined items named: kind, what was wrong, where (``quarantined``, bounded)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.quarantined: deque[dict[str, Any]] = deque(maxlen=QUARANTINE_KEEP)

    def quarantine(self, kind: str, detail: str, where: Any = None) -> None:
        self[kind] = self.get(kind, 0) + 1
        self.quarantined.append({"kind": kind, "detail": detail[:200], "where": where})


def count_error(errors: dict[str, int], kind: str, detail: str = "", where: Any = None,
                ) -> None:
    """One bad item into ``errors``: named too when it keeps them (``ErrorCounts``)."""
    if isinstance(errors, ErrorCounts):
        errors.quarantine(kind, detail or kind, where)
    else:
        errors[kind] = errors.get(kind, 0) + 1


@dataclass(slots=True)
class CollectorHealth:
    """Per collector and target: last success and errors counted by kind."""

    collector: str
    target: str
    updated: float | None = None  # when the store last wrote this row (read side only)
    last_success: float | None = None
    last_error: str | None = None
    last_error_ts: float | None = None
    errors: dict[str, int] = field(default_factory=ErrorCounts)
    counters: dict[str, float] = field(default_factory=dict)
    instance: str = ""  # the collector process that wrote the row (read side only)

    def error(self, kind: str, message: str, ts: float) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.last_error = f"{kind}: {message}"[:300]
        self.last_error_ts = ts

    def ok(self, ts: float) -> None:
        self.last_success = ts

    @property
    def quarantined(self) -> list[dict[str, Any]]:
        """The latest bad items named (kind, detail, where), oldest first."""
        return list(getattr(self.errors, "quarantined", ()))

    def count(self, key: str, n: float = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n


@dataclass
class WorkerMinute:
    """One worker's minute, rolled up by the lead collector from the raw rows: KV blocks
    stored and removed (its KV events), blocks resident when the minute was last written
    (None: not known then), and prefix-cache hit and queried tokens (its counters' rises).
    Rows summed over several workers have ``worker`` None."""

    ts: float  # the minute's start
    worker: str | None
    kv_stored: int = 0
    kv_removed: int = 0
    kv_resident: int | None = None
    hit_tokens: float = 0.0
    query_tokens: float = 0.0
