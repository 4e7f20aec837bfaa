"""One recorded request as the what-if models and ``mmlens replay`` read it.

A stored trace (``mmlens.records.RequestTrace``) plus its stored verdict becomes a
``RecordedRequest``: when it arrived, what it asked for (prompt layout, images with their size
and content identity, output length), where it went and what the engine cached. What the
store holds depends on where the request came from:

- sent by mmlens with a layout model (``mmlens collect``/``check``/the demo, ``--layout-model``):
  everything, including the per-block keys of the prompt at the layout's block size
  (content-aware ``content`` and content-blind ``shapes``) and the span layout;
- sent by mmlens without a layout model: images (size, identity), the engine's token counts,
  the worker and cached tokens; no text layout (``segments``/``keys`` None);
- seen by the tap: as above, plus the request's parts (text lengths in characters, not
  tokens), images sized and identified when the tap could read them;
- told by router logs or OTLP spans only: arrival, worker, often prompt and cached tokens,
  no images and no layout.

A field nobody told is None and named in ``unknown``; a model that needs it says what it
assumed instead (``mmlens.whatif.blocks``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mmlens.records import ImageInfo, LayoutImage, RequestTrace, Verdict

FIELDS = ("prompt_tokens", "rendered_tokens", "output_tokens", "segments", "text_chars",
          "images", "keys", "worker", "cached_tokens", "verdict", "mode")
"""The fields a recorded request may lack (``RecordedRequest.unknown`` names them)."""


@dataclass(frozen=True, slots=True)
class RecordedImage:
    """One image: its size, the router's token count for it, and its content identity (the
    blake3 hex of its bytes where known, else the Dynamo hash of its URL, prefixed ``url:``);
    None fields are unknown. Two images with the same identity are the same content."""

    width: int | None
    height: int | None
    tokens: int | None
    identity: str | None
    byte_size: int | None = None


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of the prompt in order (``mmlens.layout.composition.SpanKind`` values: text,
    special, structural, image, anchor); ``length`` in tokens of the expanded prompt."""

    kind: str
    length: int
    image_index: int | None = None


@dataclass(frozen=True, slots=True)
class BlockKeys:
    """Per full block of the expanded prompt at ``block_size``: ``content`` keys (equal keys
    at block k: equal tokens and equal images in blocks 0..k, what an engine's prefix cache
    keys on) and ``shapes`` (the same with every image's content masked: equal for two
    images of the same token count, what a content-blind router keys on). Both chained.
    ``first_image_block`` is the first block an image overlaps (None: text only)."""

    block_size: int
    content: tuple[int, ...]
    shapes: tuple[int, ...]
    first_image_block: int | None


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    request_id: str
    ts: float  # arrival
    model: str
    router: str  # the router's URL or name as recorded
    router_kind: str  # smg | dynamo | auto (unknown)
    mode: str | None  # SMG multimodal processing: router | worker; None unknown
    origin: str  # mmlens | observed
    ok: bool  # served (status < 400, no error)
    prompt_tokens: int | None  # the engine's (expanded) prompt length
    rendered_tokens: int | None  # before image expansion (router's count)
    output_tokens: int | None
    segments: tuple[Segment, ...] | None
    text_chars: tuple[int, ...] | None  # text parts' lengths in characters (the tap)
    images: tuple[RecordedImage, ...]
    keys: BlockKeys | None
    worker: str | None
    cached_tokens: int | None  # what the engine reported cached
    verdict: str | None  # the stored verdict's category (None: not judged yet)
    branch: str | None  # the router's own branch word, when it logged one
    unknown: tuple[str, ...] = ()
    latency_s: float | None = None  # arrival to last byte, as the client saw it
    ttft_s: float | None = None
    stream: bool | None = None

    @property
    def image_tokens(self) -> int | None:
        """Image tokens of the prompt (None: an image's count is unknown)."""
        counts = [im.tokens for im in self.images]
        return None if None in counts else sum(c for c in counts if c is not None)


def _hex_ints(values: Iterable[str] | None) -> tuple[int, ...] | None:
    if values is None:
        return None
    try:
        return tuple(int(v, 16) for v in values)
    except (TypeError, ValueError):
        return None


def _layout_identity(im: LayoutImage) -> str | None:
    content = im.identity.get("content")
    if not isinstance(content, str) or content.startswith("unknown:"):
        return None  # a size-only image: never assumed equal to another
    return content


def _info_identity(im: ImageInfo) -> str | None:
    ids = im.identities
    if ids.get("smg_blake3"):
        return ids["smg_blake3"]
    if ids.get("dynamo_mm_hash_url"):
        return f"url:{ids['dynamo_mm_hash_url']}"
    return None


def _images(t: RequestTrace) -> tuple[RecordedImage, ...]:
    lay = t.expected_layout
    if lay is not None and lay.ok and lay.images:
        infos = list(t.images) + [None] * (len(lay.images) - len(t.images))
        return tuple(RecordedImage(im.width, im.height, im.tokens, _layout_identity(im),
                                   info.byte_size if info is not None else None)
                     for im, info in zip(lay.images, infos, strict=False))
    return tuple(RecordedImage(im.width, im.height, im.tokens, _info_identity(im), im.byte_size)
                 for im in t.images)


def _keys(t: RequestTrace) -> BlockKeys | None:
    lay = t.expected_layout
    if lay is None or not lay.ok or lay.block_keys is None or lay.block_shapes is None:
        return None
    content, shapes = _hex_ints(lay.block_keys), _hex_ints(lay.block_shapes)
    if content is None or shapes is None or len(content) != len(shapes):
        return None
    first = min((int(b) for b, _ in (lay.block_images or [])), default=None)
    return BlockKeys(lay.block_size, content, shapes, first)


def _segments(t: RequestTrace) -> tuple[Segment, ...] | None:
    lay = t.expected_layout
    if lay is None or not lay.ok or not lay.spans:
        return None
    return tuple(Segment(s.kind, s.length, s.image_index) for s in lay.spans)


def _text_chars(t: RequestTrace) -> tuple[int, ...] | None:
    lay = t.expected_layout
    if lay is None or lay.parts is None:
        return None
    return tuple(p.chars or 0 for p in lay.parts if p.kind == "text")


def _told(t: RequestTrace, name: str, value: object) -> bool:
    """An observed request's field is known only where a source set it."""
    if value is None:
        return False
    return t.origin == "mmlens" or name in t.provenance


def _branch(t: RequestTrace) -> str | None:
    for d in reversed(t.predictions):
        if d.branch:
            return d.branch
    return None


def recorded(t: RequestTrace, verdict: Verdict | None = None) -> RecordedRequest:
    """The record of one stored trace (and its stored verdict, if judged)."""
    prompt = t.prompt_tokens if _told(t, "prompt_tokens", t.prompt_tokens) else None
    cached = t.cached_tokens if _told(t, "cached_tokens", t.cached_tokens) else None
    output = (t.completion_tokens
              if _told(t, "completion_tokens", t.completion_tokens) else None)
    worker = t.worker if _told(t, "worker", t.worker) else None
    images = _images(t)
    rec = RecordedRequest(
        request_id=t.request_id, ts=t.ts, model=t.model, router=t.router,
        router_kind=t.router_kind, mode=t.processing_mode, origin=t.origin, ok=not t.failed,
        prompt_tokens=prompt, rendered_tokens=t.rendered_tokens, output_tokens=output,
        segments=_segments(t), text_chars=_text_chars(t), images=images, keys=_keys(t),
        worker=worker, cached_tokens=cached,
        verdict=verdict.category if verdict is not None else None, branch=_branch(t),
        latency_s=t.latency_s if _told(t, "latency_s", t.latency_s) else None,
        ttft_s=t.ttft_s if _told(t, "ttft_s", t.ttft_s) else None,
        stream=t.stream if _told(t, "stream", t.stream) else None)
    missing = [name for name in FIELDS if getattr(rec, name) is None]
    if any(im.identity is None or im.tokens is None for im in images):
        missing.append("images")
    object.__setattr__(rec, "unknown", tuple(dict.fromkeys(missing)))
    return rec


def workload(traces: Iterable[RequestTrace], verdicts: Mapping[str, Verdict],
             ) -> list[RecordedRequest]:
    """Recorded requests of a window, by arrival (a request recorded twice, once)."""
    seen: set[str] = set()
    out = []
    for t in sorted(traces, key=lambda t: t.ts):
        if t.request_id in seen:
            continue
        seen.add(t.request_id)
        out.append(recorded(t, verdicts.get(t.request_id)))
    return out


def missing_counts(requests: Iterable[RecordedRequest]) -> dict[str, int]:
    """Per field of ``FIELDS``: how many of ``requests`` lack it."""
    out = dict.fromkeys(FIELDS, 0)
    for r in requests:
        for name in r.unknown:
            out[name] += 1
    return out
