"""Token layouts: how a rendered chat prompt with image anchors becomes the prompt each party
sees.

- anchor view: the rendered prompt, one anchor token per image (what the chat template emits);
- worker view: the ids a router forwards in worker mode (the anchor view, unexpanded);
- router view: the router-mode expansion, each anchor replaced by the family's expansion;
- engine view: what the engine expands with its own processor settings; its length is the
  `usage.prompt_tokens` the worker reports.

Every view carries typed spans with token offsets; blocks partition a view for a block size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from mmlens.errors import LayoutError
from mmlens.layout.families import Expansion, Family
from mmlens.layout.image_tokens import check_size, llama4_tile_grid, nemotron_request_tokens
from mmlens.layout.tokenizers import TextTokenizer


class SpanKind(StrEnum):
    TEXT = "text"
    SPECIAL = "special"  # chat-control tokens (role markers, BOS, end of turn)
    STRUCTURAL = "structural"  # image wrappers, separators, Kimi-K3's dims block
    IMAGE = "image"  # a run of repeated image tokens
    ANCHOR = "anchor"  # an unexpanded image placeholder


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image of a request: its pre-resize size, and its bytes or URL when known."""

    width: int
    height: int
    data: bytes | None = None
    url: str | None = None
    format: str | None = None

    @property
    def label(self) -> str:
        return f"{self.width}x{self.height}"


@dataclass(frozen=True, slots=True)
class Span:
    kind: SpanKind
    start: int
    length: int
    image_index: int | None = None

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True, slots=True)
class View:
    name: str
    token_ids: tuple[int, ...]
    spans: tuple[Span, ...]

    def __len__(self) -> int:
        return len(self.token_ids)

    def image_spans(self, index: int | None = None) -> list[Span]:
        return [s for s in self.spans if s.kind is SpanKind.IMAGE
                and (index is None or s.image_index == index)]


@dataclass(frozen=True, slots=True)
class Block:
    index: int
    start: int
    length: int
    full: bool
    image_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ImageLayout:
    index: int
    width: int
    height: int
    tokens: int  # router-side image-token count (pad run length, summed over tiles)
    expanded_length: int  # tokens replacing the anchor, wrapper tokens included
    engine_tokens: int


@dataclass(frozen=True)
class Layout:
    family: str
    block_size: int
    images: tuple[ImageLayout, ...]
    anchor: View
    router: View
    engine: View
    tokenizer_source: str
    synthetic_tokenizer: bool

    @property
    def worker(self) -> View:
        return self.anchor

    @property
    def engine_prompt_tokens(self) -> int:
        return len(self.engine)

    def blocks(self, view: View | None = None) -> list[Block]:
        return partition(view or self.router, self.block_size)

    def first_divergent_block(self) -> int | None:
        """First block whose ids differ between the router and engine views, if any."""
        return first_difference_block(self.router.token_ids, self.engine.token_ids,
                                      self.block_size)


def partition(view: View, block_size: int) -> list[Block]:
    """Full blocks are cacheable; a trailing partial block is not."""
    if block_size <= 0:
        raise LayoutError(f"block size must be positive, got {block_size}")
    image_ranges = [(s.start, s.end, s.image_index) for s in view.spans
                    if s.kind is SpanKind.IMAGE]
    blocks = []
    n = len(view.token_ids)
    for i, start in enumerate(range(0, n, block_size)):
        end = min(start + block_size, n)
        touching = sorted({idx for a, b, idx in image_ranges
                           if idx is not None and a < end and b > start})
        blocks.append(Block(i, start, end - start, end - start == block_size, tuple(touching)))
    return blocks


def first_difference_block(a: Sequence[int], b: Sequence[int], block_size: int) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i // block_size
    if len(a) != len(b):
        return min(len(a), len(b)) // block_size
    return None


Segment = tuple[SpanKind, list[int]]


def image_counts(
    family: Family, images: Sequence[ImageInput], params: Any, text_len: int
) -> list[int]:
    for img in images:
        check_size(img.width, img.height)
    if family.expansion is Expansion.WRAPPED_PAD_RUN:
        return nemotron_request_tokens([(i.width, i.height) for i in images], text_len, params)
    return [family.count(i.width, i.height, params) for i in images]


def expansion_segments(
    family: Family, tokenizer: TextTokenizer, image: ImageInput, n: int, params: Any,
    pad_token: str,
) -> list[Segment]:
    tid = tokenizer.token_id
    pad = tid(pad_token)
    if family.expansion is Expansion.PAD_RUN:
        return [(SpanKind.IMAGE, [pad] * n)]
    if family.expansion is Expansion.WRAPPED_PAD_RUN:
        return [(SpanKind.STRUCTURAL, [tid("<img>")]), (SpanKind.IMAGE, [pad] * n),
                (SpanKind.STRUCTURAL, [tid("</img>")])]
    if family.expansion is Expansion.KIMI_K3:
        dims = tokenizer.encode(f"image {image.width}x{image.height}")
        return [(SpanKind.STRUCTURAL, [tid("<|media_begin|>"), *dims, tid("<|media_content|>")]),
                (SpanKind.IMAGE, [pad] * n), (SpanKind.STRUCTURAL, [tid("<|media_end|>")])]
    if family.expansion is Expansion.LLAMA4_TILES:
        rows, cols = llama4_tile_grid(image.width, image.height, params)
        per_tile = params.tokens_per_tile
        segs: list[Segment] = [(SpanKind.STRUCTURAL, [tid("<|image_start|>")])]
        if rows * cols > 1:
            for _ in range(rows):
                for c in range(cols):
                    segs.append((SpanKind.IMAGE, [pad] * per_tile))
                    sep = "<|tile_x_separator|>" if c < cols - 1 else "<|tile_y_separator|>"
                    segs.append((SpanKind.STRUCTURAL, [tid(sep)]))
        segs += [(SpanKind.STRUCTURAL, [tid("<|image|>")]), (SpanKind.IMAGE, [pad] * per_tile),
                 (SpanKind.STRUCTURAL, [tid("<|image_end|>")])]
        return segs
    raise LayoutError(f"{family.name}: no expansion rule for {family.expansion}")


class ViewBuilder:
    """Appends segments, merging neighbours of the same kind (and image) into one span."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.spans: list[Span] = []

    def add(self, kind: SpanKind, ids: Sequence[int], image_index: int | None = None) -> None:
        if not ids:
            return
        last = self.spans[-1] if self.spans else None
        if (last is not None and last.kind is kind and last.image_index == image_index
                and kind is not SpanKind.ANCHOR):
            self.spans[-1] = Span(kind, last.start, last.length + len(ids), image_index)
        else:
            self.spans.append(Span(kind, len(self.ids), len(ids), image_index))
        self.ids.extend(ids)

    def view(self, name: str) -> View:
        return View(name, tuple(self.ids), tuple(self.spans))


def classify(family: Family, tokenizer: TextTokenizer) -> dict[int, SpanKind]:
    kinds = {tokenizer.token_id(t): SpanKind.SPECIAL for t in family.special_ids
             if t not in family.structural}
    for t in family.structural:
        kinds[tokenizer.token_id(t)] = SpanKind.STRUCTURAL
    return kinds


def build_view(
    name: str, rendered: Sequence[int], anchor_positions: Sequence[int],
    kinds: Mapping[int, SpanKind], expansions: Sequence[list[Segment]] | None,
) -> View:
    builder = ViewBuilder()
    anchors = {pos: i for i, pos in enumerate(anchor_positions)}
    for pos, tok in enumerate(rendered):
        image_index = anchors.get(pos)
        if image_index is None:
            builder.add(kinds.get(tok, SpanKind.TEXT), [tok])
        elif expansions is None:
            builder.add(SpanKind.ANCHOR, [tok], image_index)
        else:
            for kind, ids in expansions[image_index]:
                builder.add(kind, ids, image_index if kind is SpanKind.IMAGE else None)
    return builder.view(name)


def build_layout(
    family: Family,
    rendered_ids: Sequence[int],
    images: Sequence[ImageInput],
    tokenizer: TextTokenizer,
    *,
    processor_config: Mapping[str, Any] | None = None,
    engine_processor_config: Mapping[str, Any] | None = None,
    engine_count_drift: int = 0,
    block_size: int = 16,
    counts: Sequence[int] | None = None,
) -> Layout:
    """Lay out a rendered prompt whose anchors stand for `images`, in order.

    `counts` (one N per image) replaces the family's formula in both views: a router's own
    count (mmlens.layout.router_views)."""
    if block_size <= 0:
        raise LayoutError(f"block size must be positive, got {block_size}")
    if len(images) > family.max_images:
        raise LayoutError(
            f"{family.display} accepts at most {family.max_images} images per request, "
            f"got {len(images)}"
        )
    anchor_id = tokenizer.token_id(family.anchor)
    positions = [i for i, t in enumerate(rendered_ids) if t == anchor_id]
    if len(positions) != len(images):
        raise LayoutError(
            f"the prompt has {len(positions)} image anchor(s) {family.anchor} but the request "
            f"carries {len(images)} image(s)"
        )
    text_len = len(rendered_ids) - len(images)
    if counts is not None:
        if len(counts) != len(images):
            raise LayoutError(f"{len(counts)} count(s) for {len(images)} image(s)")
        for img in images:
            check_size(img.width, img.height)
        params = engine_params = (family.params(processor_config)
                                  if family.expansion is Expansion.LLAMA4_TILES else None)
        counts = engine_counts = list(counts)
    else:
        params = family.params(processor_config)
        engine_params = (params if engine_processor_config is None
                         else family.params(engine_processor_config))
        counts = image_counts(family, images, params, text_len)
        engine_counts = image_counts(family, images, engine_params, text_len)
    if engine_count_drift:
        engine_counts = [max(1, n + engine_count_drift) for n in engine_counts]

    router_exp = [expansion_segments(family, tokenizer, img, n, params, family.router_pad_token)
                  for img, n in zip(images, counts, strict=True)]
    engine_exp = [expansion_segments(family, tokenizer, img, n, engine_params, family.pad)
                  for img, n in zip(images, engine_counts, strict=True)]
    kinds = classify(family, tokenizer)
    anchor_view = build_view("anchor", rendered_ids, positions, kinds, None)
    router_view = build_view("router", rendered_ids, positions, kinds, router_exp)
    engine_view = build_view("engine", rendered_ids, positions, kinds, engine_exp)

    image_layouts = tuple(
        ImageLayout(
            index=i, width=img.width, height=img.height,
            tokens=sum(len(ids) for k, ids in router_exp[i] if k is SpanKind.IMAGE),
            expanded_length=sum(len(ids) for _, ids in router_exp[i]),
            engine_tokens=sum(len(ids) for k, ids in engine_exp[i] if k is SpanKind.IMAGE),
        )
        for i, img in enumerate(images)
    )
    return Layout(
        family=family.name, block_size=block_size, images=image_layouts,
        anchor=anchor_view, router=router_view, engine=engine_view,
        tokenizer_source=tokenizer.source, synthetic_tokenizer=tokenizer.synthetic,
    )


Part = str | ImageInput


def compose(
    family: Family, parts: Sequence[Part], tokenizer: TextTokenizer, **kwargs: Any
) -> Layout:
    """Render a one-turn user message (text and images in order) with the family's chat
    format, tokenize it, and lay it out."""
    text_parts: list[str | None] = []
    images: list[ImageInput] = []
    for part in parts:
        if isinstance(part, ImageInput):
            text_parts.append(None)
            images.append(part)
        else:
            if family.anchor in part:
                raise LayoutError(
                    f"text contains the image anchor {family.anchor}; images are given as parts"
                )
            text_parts.append(part)
    rendered = tokenizer.encode(family.chat.render(text_parts))
    return build_layout(family, rendered, images, tokenizer, **kwargs)
