"""What the availability question needs to know about one request, from its trace.

A request is usable when its expected layout carries block keys: sent by mmlens, tapped, or
observed with known content. Everything else here comes from the trace's routing decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import xxhash

from mmlens.analysis.judgement.vocabulary import FALLBACK_MARKERS
from mmlens.ingest.observed import known
from mmlens.layout.content_keys import BlockShapes
from mmlens.records import RequestTrace, RoutingDecision

Fidelity = Literal["exact", "degraded", "text_prefix", "unknown"]
"""How a router's view of an image request keyed its images: by identity (exact), by token
ids that two images of one size share (degraded), or by text alone (text_prefix)."""


@dataclass(slots=True)
class RouterView:
    """What the router said about its choice."""

    logged: bool = False  # any decision (header or log line) reached mmlens
    predicted_blocks: int | None = None  # overlap it credited the chosen worker with
    request_blocks: int | None = None
    spill: bool = False  # a spill gate fired or the branch says so
    branch: str | None = None
    fallback: list[str] = field(default_factory=list)  # text-prefix fallback warnings
    credited: dict[str, float] = field(default_factory=dict)  # worker → blocks it credited


@dataclass(slots=True)
class RequestFacts:
    request_id: str
    router: str
    router_kind: str
    model: str
    ts: float  # decision time
    prefill_ts: float
    done_ts: float
    unit: str | None  # chosen worker (``worker#rank`` beyond rank 0)
    block_size: int
    prompt_tokens: int | None
    expected_prompt_tokens: int | None
    cached_tokens: int
    content_ids: tuple[str, ...]
    shapes: BlockShapes | None  # None: only the content keys below are known
    content_keys: tuple[int, ...]
    # The names an engine behind this router gives the images, where mmlens can tell: behind
    # Dynamo, the frontend's mm_hash (of the URL string), which workers key blocks by.
    router_ids: tuple[str, ...] | None
    router_view: RouterView
    fidelity: Fidelity
    failed: bool

    @property
    def images(self) -> int:
        return len(self.content_ids)

    @property
    def count_drift(self) -> bool:
        return (self.prompt_tokens is not None and self.expected_prompt_tokens is not None
                and self.prompt_tokens != self.expected_prompt_tokens)

    def history_keys(self) -> tuple[int, ...]:
        """The keys an engine behind this router gives the blocks (the request history
        model): under the router's image names where known, else the content keys."""
        if self.router_ids is None or self.shapes is None:
            return self.content_keys
        return tuple(self.shapes.keys(self.router_ids))

    def first_image_block(self) -> int | None:
        if self.shapes is None:
            return None
        return next((b for b, imgs in enumerate(self.shapes.images) if imgs), None)


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def unit_label(worker: str, rank: int | None) -> str:
    return worker if not rank else f"{worker}#{rank}"


def router_view(predictions: list[RoutingDecision]) -> RouterView:
    view = RouterView(logged=bool(predictions))
    for d in predictions:
        if d.overlap_blocks is not None and view.predicted_blocks is None:
            view.predicted_blocks = d.overlap_blocks
            view.request_blocks = d.request_blocks
        view.branch = view.branch or d.branch
        if any(g.spill for g in d.gates) or "spill" in (d.branch or ""):
            view.spill = True
        view.fallback += [w for w in d.warnings if any(m in w.lower() for m in FALLBACK_MARKERS)]
        for s in d.scores:
            if s.worker and s.device_blocks is not None and s.source in (
                    "cost", "logit", "policy_affinity"):
                view.credited[s.worker] = s.device_blocks
    return view


def _decision_ts(trace: RequestTrace) -> float:
    """When the router chose: its own dispatch time where it logged one within the request's
    life (a log line's time, kept to the second, falls before the send and is not used),
    else when mmlens sent the request."""
    end = trace.ts + (trace.latency_s or 0.0)
    logged = [d.ts for d in trace.predictions if d.ts is not None and trace.ts <= d.ts <= end]
    return min(logged) if logged else trace.ts


def fidelity(trace: RequestTrace, view: RouterView, layout: Any, drift: bool) -> Fidelity:
    if not _get(layout, "images"):
        return "unknown"
    if view.fallback:
        return "text_prefix"
    if trace.router_kind == "dynamo":
        exact = _get(_get(_get(layout, "routers"), "dynamo"), "exact_mm_routing")
        if exact is False:
            return "text_prefix"
        return "degraded" if drift else "exact"
    if trace.router_kind == "smg" and trace.worker:
        # SMG's HTTP router routes on the text parts only, and so does its gRPC router in
        # worker mode (one anchor per image: no engine image block ever matches it); in
        # router mode on expanded ids, blind to which image filled them.
        text_only = trace.worker.startswith("http") or trace.processing_mode == "worker"
        return "text_prefix" if text_only else "degraded"
    return "unknown"


def facts_of(trace: RequestTrace, default_block_size: int = 16) -> RequestFacts | None:
    """None when the trace has no usable layout (no block keys) or nobody said how many
    tokens the engine cached (an observed request)."""
    lay = trace.expected_layout
    keys = _get(lay, "block_keys")
    if not isinstance(keys, list) or not known(trace, "cached_tokens"):
        return None
    bs = int(_get(lay, "block_size") or default_block_size)
    images = _get(lay, "images") or []
    content_ids = tuple(_content_id(im, f"{trace.request_id}#{i}")
                        for i, im in enumerate(images))
    shapes = _shapes(lay)
    if shapes is not None and len(shapes.shapes) != len(keys):
        shapes = None
    view = router_view(trace.predictions)
    expected = _get(lay, "engine_prompt_tokens")
    drift = (trace.prompt_tokens is not None and expected is not None
             and trace.prompt_tokens != expected)
    ts = _decision_ts(trace)
    done = trace.ts + (trace.latency_s or 0.0)
    return RequestFacts(
        request_id=trace.request_id, router=trace.router, router_kind=trace.router_kind,
        model=trace.model, ts=ts, prefill_ts=trace.ts + (trace.ttft_s or trace.latency_s or 0.0),
        done_ts=done, unit=(unit_label(trace.worker, trace.dp_rank)
                            if trace.worker and known(trace, "worker") else None),
        block_size=bs, prompt_tokens=trace.prompt_tokens, expected_prompt_tokens=expected,
        cached_tokens=int(trace.cached_tokens or 0), content_ids=content_ids, shapes=shapes,
        content_keys=tuple(_key(k) for k in keys), router_ids=_router_ids(trace, images),
        router_view=view,
        fidelity=fidelity(trace, view, lay, drift),
        failed=trace.error is not None or (trace.status or 200) >= 400)


def _router_ids(trace: RequestTrace, images: list[Any]) -> tuple[str, ...] | None:
    if trace.router_kind != "dynamo" or not images:
        return None
    hashes = [_get(_get(im, "identity"), "dynamo_mm_hash") for im in images]
    if any(h is None for h in hashes):
        return None
    return tuple(f"dynamo:{h}" for h in hashes)


def _key(text: str) -> int:
    """A stored block key (16 hex) as an int; any other string stands for itself."""
    try:
        return int(text, 16)
    except ValueError:
        return xxhash.xxh3_64_intdigest(str(text).encode())


def _content_id(image: Any, unique: str) -> str:
    """The identity the layout keyed an image by; a request-unique name when unknown (an
    image of unknown content must never match another)."""
    ident = _get(image, "identity")
    return str(_get(ident, "content") or _get(ident, "smg") or f"unknown:{unique}")


def _shapes(lay: Any) -> BlockShapes | None:
    shapes = _get(lay, "block_shapes")
    if not isinstance(shapes, list):
        return None
    per_block: list[tuple[tuple[int, int], ...]] = [()] * len(shapes)
    for b, imgs in _get(lay, "block_images") or []:
        if 0 <= b < len(per_block):
            per_block[b] = tuple((int(i), int(off)) for i, off in imgs)
    return BlockShapes(tuple(_key(s) for s in shapes), tuple(per_block))
