"""Typed records the collectors produce and the store, snapshot and pages consume.

Plain frozen dataclasses: they cross the collector → store → page boundary and must stay
cheap to build (KV events arrive at hundreds of thousands of blocks per second).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NamedTuple

# The stored layout's records live with the layout; re-exported here with the other records.
from mmlens.layout.expected import ExpectedLayout as ExpectedLayout
from mmlens.layout.expected import LayoutImage as LayoutImage
from mmlens.layout.expected import LayoutPart as LayoutPart
from mmlens.layout.expected import LayoutSpan as LayoutSpan
from mmlens.layout.expected import ViewCount as ViewCount

Labels = tuple[tuple[str, str], ...]
"""Label pairs sorted by name; hashable so a series can be a dict key."""

BlockHash = int | str
"""An engine block hash: unsigned 64-bit int, or lowercase hex when the engine sent bytes."""

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


# --- KV events -------------------------------------------------------------------------


class ImageRef(NamedTuple):
    """An image identifier found in a block's ``extra_keys`` and its offset in that block.

    A NamedTuple: the hot decode path builds plain ``(identifier, offset)`` tuples, which
    compare equal to ImageRef values.
    """

    identifier: str
    offset: int | None


@dataclass(slots=True)
class BlockStored:
    worker: str
    rank: int
    seq: int
    ts: float
    block_hashes: list[BlockHash]
    parent: BlockHash | None
    token_ids: list[int]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    # Per block: image refs found in that block's extra_keys (None = no image in the block).
    images: list[tuple[ImageRef, ...] | None] | None = None
    idx: int = 0  # position in its batch: with (worker, rank, seq, ts) the event's store key
    kind: Literal["stored"] = "stored"
    # Set by the resident index: per block, the content key (``mmlens.layout.content_keys``)
    # and the shape key; None when the parent block's content is unknown.
    keys: list[int] | None = None
    shapes: list[int] | None = None


@dataclass(slots=True)
class BlockRemoved:
    worker: str
    rank: int
    seq: int
    ts: float
    block_hashes: list[BlockHash]
    medium: str | None = None
    idx: int = 0
    kind: Literal["removed"] = "removed"
    keys: list[int] | None = None  # content keys of the removed blocks known to the index


@dataclass(slots=True)
class AllBlocksCleared:
    worker: str
    rank: int
    seq: int
    ts: float
    idx: int = 0
    kind: Literal["cleared"] = "cleared"


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
"""Not frozen (a frozen dataclass sets each field through object.__setattr__, the largest
per-event cost after decoding); treat them as immutable."""


@dataclass(slots=True)
class KVEventRow:
    """A stored KV event as the store returns it: one row per event, block hashes decoded
    (empty where the query did not ask for them), image identifiers of stored blocks."""

    ts: float
    worker: str
    rank: int
    seq: int
    kind: Literal["stored", "removed", "cleared"]
    n_blocks: int
    parent: BlockHash | None = None
    block_hashes: list[BlockHash] = field(default_factory=list)
    images: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ResidentSummary:
    """Blocks resident on one worker rank, as the KV-event index last summarized them."""

    worker: str
    rank: int
    resident_blocks: int = 0
    images: dict[str, int] = field(default_factory=dict)  # identifier → resident blocks
    stored: int = 0
    removed: int = 0
    removed_unknown: int = 0
    clears: int = 0
    restarts: int = 0
    transport: str | None = None  # how its KV events arrive: zmq, grpc, nats, zmq-broker
    updated: float | None = None

    @property
    def label(self) -> str:
        """``worker``, or ``worker#rank`` beyond rank 0."""
        return self.worker if not self.rank else f"{self.worker}#{self.rank}"


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


# --- Per-request traces and routing decisions --------------------------------------------


@dataclass(slots=True)
class ImageInfo:
    """An image a trace sent: size and, where computable, its identity per router scheme."""

    url_kind: Literal["data", "http"]
    byte_size: int | None = None
    width: int | None = None
    height: int | None = None
    identities: dict[str, str] = field(default_factory=dict)
    tokens: int | None = None  # the router's image-token count, when it logged one


@dataclass(slots=True)
class RoutingCandidate:
    """A worker the router considered (SMG cache trace ``candidates``; Dynamo cost lines)."""

    worker: str
    load: float | None = None
    healthy: bool | None = None
    overloaded: bool | None = None


@dataclass(slots=True)
class RoutingScore:
    """One score the router computed for a worker.

    ``source`` is the router's own word: SMG ``policy_affinity`` (``value`` = effective score
    in blocks) or ``expected_wait`` (``value`` in seconds); Dynamo ``cost`` (a ``Formula``
    line, lower wins) or ``logit`` (the winner's cost on ``Selected worker``).
    """

    source: str
    worker: str | None = None
    value: float | None = None
    unit: str | None = None
    device_blocks: float | None = None
    request_blocks: int | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class SpillGate:
    """SMG's spill gate for the preferred worker: spill to min-load when ``load`` exceeds
    both ``average_load × relative_threshold`` and ``average_load + absolute_threshold``."""

    worker: str | None = None
    load: float | None = None
    average_load: float | None = None
    relative_threshold: float | None = None
    absolute_threshold: float | None = None
    absolute_margin: float | None = None
    spill: bool | None = None


@dataclass(slots=True)
class RoutingDecision:
    """What a router said about one request, from logs, headers or response fields."""

    request_id: str
    router: Literal["smg", "dynamo"]
    source: str
    worker: str | None = None
    branch: str | None = None
    overlap_blocks: int | None = None
    request_blocks: int | None = None
    block_size: int | None = None
    matched_ratio: float | None = None
    kv_hit_rate: float | None = None
    original_tokens: int | None = None
    expanded_tokens: int | None = None
    image_tokens: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    ts: float | None = None
    policy: str | None = None
    origin: str | None = None
    prediction_source: str | None = None
    matched_units: int | None = None
    input_units: int | None = None
    candidates: list[RoutingCandidate] = field(default_factory=list)
    scores: list[RoutingScore] = field(default_factory=list)
    gates: list[SpillGate] = field(default_factory=list)


@dataclass(slots=True)
class RequestTrace:
    request_id: str
    router: str
    router_kind: str
    model: str
    ts: float
    stream: bool
    images: list[ImageInfo] = field(default_factory=list)
    status: int | None = None
    worker: str | None = None
    dp_rank: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int = 0
    completion_tokens: int | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    processing_mode: str | None = None
    predictions: list[RoutingDecision] = field(default_factory=list)
    expected_layout: ExpectedLayout | None = None
    error: str | None = None
    error_code: str | None = None
    response_id: str | None = None
    # Where the request came from and which source said what (observed traffic, issue 11):
    # origin "mmlens" (sent by mmlens) or "observed" (router logs, OTLP spans, the tap);
    # provenance maps a field name to the source that set it; a field of an observed request
    # without provenance is unknown, whatever its default value.
    origin: str = "mmlens"
    sources: list[str] = field(default_factory=list)
    provenance: dict[str, str] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)
    trace_id: str | None = None
    rendered_tokens: int | None = None  # the prompt before image expansion (router's count)

    @property
    def failed(self) -> bool:
        return self.error is not None or (self.status or 200) >= 400

    def to_json(self) -> dict[str, Any]:
        """The stored and printed shape: every field, the layout in its summary shape."""
        out = asdict(self)
        out["expected_layout"] = (None if self.expected_layout is None
                                  else self.expected_layout.to_json())
        return out


# --- Collector health ----------------------------------------------------------------------


@dataclass(slots=True)
class CollectorHealth:
    """Per collector and target: last success and errors counted by kind."""

    collector: str
    target: str
    updated: float | None = None  # when the store last wrote this row (read side only)
    last_success: float | None = None
    last_error: str | None = None
    last_error_ts: float | None = None
    errors: dict[str, int] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    instance: str = ""  # the collector process that wrote the row (read side only)

    def error(self, kind: str, message: str, ts: float) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.last_error = f"{kind}: {message}"[:300]
        self.last_error_ts = ts

    def ok(self, ts: float) -> None:
        self.last_success = ts

    def count(self, key: str, n: float = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n


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


# --- Available vs achieved ----------------------------------------------------------------


@dataclass(slots=True)
class Availability:
    """Available vs achieved for one request (``mmlens.analysis.availability``): tokens
    each worker could have served when the router chose, the best, what the engine cached,
    and the avoidable difference by cause."""

    request_id: str
    ts: float
    router: str
    router_kind: str
    model: str
    worker: str | None
    block_size: int
    prompt_tokens: int
    images: int
    fidelity: str  # exact | degraded | text_prefix | unknown (how the router keyed images)
    available: dict[str, int]  # worker → tokens it could have served at decision time
    best_worker: str | None
    best_tokens: int
    chosen_tokens: int
    realized_tokens: int
    avoidable_tokens: int
    causes: dict[str, int] = field(default_factory=dict)
    not_cacheable_tokens: int = 0
    unseen_tokens: int = 0
    predicted_tokens: int | None = None
    request_blocks: int | None = None
    false_hit_tokens: int = 0
    false_hit_cause: str | None = None
    identities_resolved: bool = True
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
