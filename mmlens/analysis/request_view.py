"""One request as the inspector shows it: views, blocks, counts and where router and worker part.

Input is a stored ``RequestTrace`` or a layout composed on the page. When the trace's expected
layout kept the prompt text and the model (the sender opted in), the full layout with token
ids is rebuilt; otherwise the stored layout's router-view spans and per-block content keys are
shown and the worker view is derived by folding each image run back into one anchor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mmlens.layout.composition import ImageInput, Layout, Span, SpanKind, View
from mmlens.layout.hashing import block_hashes, dynamo_routing, vllm_extra_keys
from mmlens.records import ExpectedLayout, LayoutSpan, RequestTrace


@dataclass(frozen=True, slots=True)
class ViewRow:
    """One horizontal bar of the layout figure."""

    name: str
    length: int
    spans: tuple[Span, ...]
    block_hashes: tuple[int, ...] = ()  # per full block; empty when ids are unknown
    block_images: tuple[tuple[str, ...], ...] = ()  # per full block: image identifiers
    block_keys: tuple[str, ...] = ()  # per full block: stored content key (no token ids)


@dataclass(frozen=True, slots=True)
class Divergence:
    block: int
    reason: str  # count_drift | wrapper | image_identity
    detail: str


@dataclass(slots=True)
class RequestView:
    request_id: str | None
    block_size: int
    rows: list[ViewRow]
    image_labels: list[str]  # short identity per image index, for colours and legends
    counts: dict[str, int | None]
    cached_tokens: int | None = None
    predicted_tokens: int | None = None
    worker: str | None = None
    divergences: list[Divergence] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    full_ids: bool = False


def short_id(identity: str | int | None, n: int = 8) -> str:
    if identity is None:
        return "?"
    text = f"{identity:016x}" if isinstance(identity, int) else str(identity)
    return text[:n]


def image_label(index: int, identity: str | int | None) -> str:
    return f"image {index} · {short_id(identity)}"


def fold_images(spans: Sequence[Span]) -> tuple[Span, ...]:
    """The worker view from router spans: each image run becomes one anchor token.

    ``[text 0+4, image 4+64 (0), text 68+13]`` → ``[text 0+4, anchor 4+1 (0), text 5+13]``.
    """
    out: list[Span] = []
    pos = 0
    seen: set[int | None] = set()
    for s in spans:
        if s.kind is SpanKind.IMAGE:
            if s.image_index in seen:
                continue  # later tiles of a tiled image fold into the first one's anchor
            seen.add(s.image_index)
            out.append(Span(SpanKind.ANCHOR, pos, 1, s.image_index))
            pos += 1
        else:
            out.append(Span(s.kind, pos, s.length, s.image_index))
            pos += s.length
    return tuple(out)


def spans_from_layout(items: Sequence[LayoutSpan]) -> tuple[Span, ...]:
    return tuple(Span(SpanKind(s.kind), s.start, s.length, s.image_index) for s in items)


def _row(name: str, view: View, block_size: int, identifiers: Sequence[str] | None) -> ViewRow:
    hashes = tuple(block_hashes(view.token_ids, block_size))
    per_block: tuple[tuple[str, ...], ...] = ()
    n_images = len({s.image_index for s in view.spans if s.kind is SpanKind.IMAGE})
    if identifiers is not None and n_images == len(identifiers) and n_images:
        keys = vllm_extra_keys(view, identifiers, block_size)
        per_block = tuple(tuple(f"{short_id(i)}@{off}" for i, off in k) if k else ()
                          for k in keys)
    return ViewRow(name, len(view), view.spans, hashes, per_block)


def from_layout(layout: Layout, identities: Sequence[str | int | None] = (),
                request_id: str | None = None,
                dynamo_mm_hashes: Sequence[int] | None = None) -> RequestView:
    """A composed (or rebuilt) layout: every view's ids are known. With ``dynamo_mm_hashes``
    the router row carries Dynamo's block hashes (image runs as per-image pad values)."""
    idents = list(identities) + [None] * (len(layout.images) - len(identities))
    labels = [image_label(i, ident) for i, ident in enumerate(idents)]
    id_strs = [short_id(x, 64) for x in idents] if all(x is not None for x in idents) else None
    bs = layout.block_size
    router_row = _row(f"router view ({len(layout.router)})", layout.router, bs, id_strs)
    dynamo_note = None
    if dynamo_mm_hashes is not None and len(dynamo_mm_hashes) == len(layout.images):
        routing = dynamo_routing(layout, dynamo_mm_hashes)
        router_row = ViewRow(router_row.name, router_row.length, router_row.spans,
                             routing.block_hashes, router_row.block_images)
        labels = [f"{label} · pad {pad}" for label, pad in zip(labels, routing.pad_values,
                                                                 strict=True)]
        dynamo_note = (
            f"Dynamo's routing view: {routing.expanded_prompt_len} tokens zero-padded to "
            f"{len(routing.routing_ids)} ({len(routing.block_hashes)} routing blocks); each "
            "image run is its pad value: " + ", ".join(
                f"image {i} → {pad}" for i, pad in enumerate(routing.pad_values)))
    rows = [router_row]
    if layout.engine.token_ids != layout.router.token_ids:
        # Only when it differs: the engine's own expansion, to see where it parts ways.
        rows.append(_row(f"engine view ({len(layout.engine)})", layout.engine, bs, id_strs))
    rows.append(_row(f"worker view ({len(layout.worker)})", layout.worker, bs, None))
    rv = RequestView(request_id, bs, rows, labels, counts={
        "anchor_view": len(layout.anchor), "router_view": len(layout.router),
        "worker_view": len(layout.worker), "engine_expected": layout.engine_prompt_tokens,
        "engine_prompt_tokens": None}, full_ids=True)
    if dynamo_note:
        rv.notes.append(dynamo_note)
    first = layout.first_divergent_block()
    if first is not None:
        drift = [im for im in layout.images if im.tokens != im.engine_tokens]
        if drift:
            im = drift[0]
            rv.divergences.append(Divergence(first, "count_drift", (
                f"image {im.index}: router expands to {im.tokens} tokens, the engine to "
                f"{im.engine_tokens}; every block from {first} on differs")))
        else:
            rv.divergences.append(Divergence(first, "wrapper", (
                "router and engine fill the image run with different token ids "
                "(pad vs placeholder) or wrap it differently")))
    return rv


def _image_identities(trace: RequestTrace) -> list[str | None]:
    return [im.identities.get("smg_blake3") or im.identities.get("dynamo_mm_hash_url")
            for im in trace.images]


def _dynamo_hashes(trace: RequestTrace) -> list[int] | None:
    if trace.router_kind != "dynamo":
        return None
    out = []
    for im in trace.images:
        h = im.identities.get("dynamo_mm_hash_url")
        if not h:
            return None
        out.append(int(h, 16))
    return out


def predicted_tokens(trace: RequestTrace) -> int | None:
    """Tokens the router expected to find cached: overlap blocks × block size, or Dynamo's
    predicted ratio × prompt tokens."""
    # Block counts first: Dynamo's `nvext.timing` (a ratio) usually precedes the log line
    # `[ROUTING] Best … X/Y` that says the same in whole blocks.
    for p in trace.predictions:
        if p.overlap_blocks is not None:
            return p.overlap_blocks * (p.block_size or 16)
    for p in trace.predictions:
        if p.kv_hit_rate is not None and trace.prompt_tokens:
            return round(p.kv_hit_rate * trace.prompt_tokens)
    return None


def _from_stored(trace: RequestTrace, lay: ExpectedLayout,
                 identities: Sequence[str | None]) -> RequestView:
    """The stored layout without token ids: router spans, per-block content keys."""
    spans = spans_from_layout(lay.spans)
    bs = lay.block_size
    router_len = lay.router_view.token_count if lay.router_view else 0
    worker_spans = fold_images(spans)
    worker_len = sum(s.length for s in worker_spans)
    labels = [image_label(i, identities[i] if i < len(identities) else None)
              for i in range(len(lay.images))]
    rv = RequestView(trace.request_id, bs, [
        ViewRow(f"router view ({router_len})", router_len, spans,
                block_keys=tuple(lay.block_keys or ())),
        ViewRow(f"worker view ({worker_len})", worker_len, worker_spans),
    ], labels, counts={
        "anchor_view": lay.anchor_view.token_count if lay.anchor_view else None,
        "router_view": router_len,
        "worker_view": lay.worker_view.token_count if lay.worker_view else None,
        "engine_expected": lay.engine_prompt_tokens,
        "engine_prompt_tokens": None})
    rv.notes.append("the prompt text was not stored with this request: spans and per-block "
                    "content keys (token ids + image identities) come from the stored layout; "
                    "token-id block hashes are not shown")
    dyn = lay.routers.get("dynamo") or {}
    if trace.router_kind == "dynamo" and dyn.get("pad_values"):
        rv.notes.append(
            f"Dynamo's routing view: {dyn.get('expanded_prompt_len')} tokens zero-padded to "
            f"{dyn.get('total_tokens')} ({dyn.get('routing_blocks')} routing blocks); each "
            "image run is its pad value: " + ", ".join(
                f"image {i} → {pad}" for i, pad in enumerate(dyn["pad_values"])))
    return rv


def _no_layout(trace: RequestTrace) -> RequestView:
    rv = RequestView(trace.request_id, 16, [], [], counts={
        "anchor_view": None, "router_view": None, "worker_view": None,
        "engine_expected": None, "engine_prompt_tokens": None})
    err = trace.expected_layout.error if trace.expected_layout else None
    rv.notes.append(f"no expected layout: {err}" if err else
                    "no expected layout was recorded for this request")
    return rv


def from_trace(trace: RequestTrace, layout: Layout | None = None) -> RequestView:
    """The inspector's view of a recorded request. ``layout`` is the rebuilt full layout when
    the caller could rebuild it (see ``rebuild_parts``)."""
    lay = trace.expected_layout
    identities = _image_identities(trace)
    if layout is not None:
        rv = from_layout(layout, identities, trace.request_id,
                         dynamo_mm_hashes=_dynamo_hashes(trace))
        if trace.router_kind == "dynamo":
            rv.notes.append("router-view block hashes follow Dynamo's scheme: each image run "
                            "hashed as its pad value 1_000_000 + (mm_hash & 2^30−1), the "
                            "prompt zero-padded to a block multiple")
    elif lay is not None and lay.ok and lay.spans:
        rv = _from_stored(trace, lay, identities)
    else:
        rv = _no_layout(trace)
    rv.counts["engine_prompt_tokens"] = trace.prompt_tokens
    rv.cached_tokens = trace.cached_tokens
    rv.predicted_tokens = predicted_tokens(trace)
    rv.worker = trace.worker
    if trace.processing_mode == "worker":
        rv.notes.append("worker mode: the router forwarded the worker view (one anchor per "
                        "image) and routed on it; the worker expanded the images itself")
    explain_observed(rv)
    return rv


def _first_image_start(rv: RequestView) -> int | None:
    if not rv.rows:
        return None
    starts = [s.start for s in rv.rows[0].spans if s.kind is SpanKind.IMAGE]
    return min(starts) if starts else None


def explain_observed(rv: RequestView) -> None:
    """Compare what the engine reported with the expected layout and the router's prediction."""
    bs = rv.block_size
    expected = rv.counts.get("engine_expected")
    observed = rv.counts.get("engine_prompt_tokens")
    if (expected is not None and observed is not None and expected != observed
            and not any(d.reason == "count_drift" for d in rv.divergences)):
        start = _first_image_start(rv)
        n_img = sum(s.length for s in rv.rows[0].spans if s.kind is SpanKind.IMAGE) if rv.rows \
            else 0
        if start is not None:
            first = (start + min(n_img, n_img + observed - expected)) // bs
            why = (f"the engine reported {observed} prompt tokens, the router's layout has "
                   f"{expected}: the image-token counts differ by {observed - expected}, so "
                   f"blocks from {first} on cannot match")
        else:
            first = min(expected, observed) // bs
            why = (f"the engine reported {observed} prompt tokens where {expected} were "
                   "expected (wrapper or template difference)")
        rv.divergences.append(Divergence(first, "count_drift" if start is not None
                                         else "wrapper", why))
    predicted, cached = rv.predicted_tokens, rv.cached_tokens
    if predicted is not None and cached is not None and predicted >= cached + bs:
        start = _first_image_start(rv)
        block = (cached // bs) if start is None else max(cached // bs, 0)
        rv.divergences.append(Divergence(block, "image_identity", (
            f"the router predicted {predicted} cached tokens ({predicted // bs} blocks) but the "
            f"engine found {cached}: the router matched token ids, the engine keys image "
            "blocks by image content, so a different image with the same size looks like a "
            "hit to the router (content-blind false hit)")))


def rebuild_parts(trace: RequestTrace) -> tuple[str, list[ImageInput | str], int] | None:
    """``(model, parts, block_size)`` to rebuild a trace's full layout, when its expected
    layout kept the text and model (stored only when the sender opted in)."""
    lay = trace.expected_layout
    if lay is None or lay.text is None or not lay.layout_model:
        return None
    images: list[ImageInput | str] = []
    for im in trace.images:
        if not im.width or not im.height:
            return None
        images.append(ImageInput(im.width, im.height))
    return lay.layout_model, [*images, lay.text], lay.block_size
