"""Per-request records: the trace of a request (sent by mmlens or observed), the routing
decisions routers said they made for it, and its available-vs-achieved evaluation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from mmlens.layout.expected import ExpectedLayout


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
    # The router's 0-based dispatch attempt (SMG's cache trace ``attempt``; a retry after a
    # failed worker is attempt 1); None = unknown. The attempt that served is the last one
    # with a response.
    attempt: int | None = None
    # SMG's approximate tree: the prefix units (tokens) it credited the chosen worker with
    # (0 after a spill, whatever matched on the worker it spilled from).
    credited_units: int | None = None


@dataclass(slots=True)
class RequestTrace:
    request_id: str
    router: str
    router_kind: str
    model: str
    ts: float
    stream: bool | None  # None: unknown (an observed request no source said it of)
    images: list[ImageInfo] = field(default_factory=list)
    status: int | None = None
    worker: str | None = None
    dp_rank: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = 0  # None: unknown (observed, no source told it)
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
    # The latest the response can have ended, where its latency does not say it (SMG logs a
    # streamed body's end on a line of its own, stamped to the second).
    ended_by: float | None = None
    # Where its router's log said it was dispatched (the serving attempt) and that it was
    # completed: line numbers of one log (``mmlens.analysis.judgement.order``). Its lines'
    # order is exact where their times are whole seconds.
    sent_seq: int | None = None
    ended_seq: int | None = None
    # When each worker's own log says the request reached it (worker id → the engine's
    # clock, to the microsecond: Dynamo's ingress line): its blocks there were stored after.
    engine_received: dict[str, float] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.error is not None or (self.status or 200) >= 400

    def to_json(self) -> dict[str, Any]:
        """The printed shape: every field, the layout in its summary shape; an observed
        request's model and router no source named are null (stored, they are empty)."""
        out = asdict(self)
        out["expected_layout"] = (None if self.expected_layout is None
                                  else self.expected_layout.to_json())
        if self.origin == "observed":
            for name in ("model", "router"):
                if not out[name] and name not in self.provenance:
                    out[name] = None
        return out


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
