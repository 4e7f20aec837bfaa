"""Content keys: per-block prefix-cache keys that a layout and an engine's KV events agree on.

A block's key combines two chains over the blocks up to it:
- shape: the block's token ids, every image-run token replaced by ``IMAGE_TOKEN``, and the
  offsets of the images overlapping it (image start − block start, negative when the image
  began earlier);
- identity: the identifiers of those images, in start order.

Equal keys at block k mean equal tokens and equal images in blocks 0..k, however each side
names its images' run tokens (vLLM keeps the placeholder id, Dynamo's workers a per-image pad
value). A layout computes them with its content identities; an engine's ``BlockStored`` events
give them with the engine's own identifiers from ``extra_keys``. The shape chain needs no
identity, so a layout's shapes plus the engine's identifiers for its images give the keys the
engine's blocks carry.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from mmlens.layout.composition import SpanKind, View

ROOT = 0
"""Shape and identity state before the first block."""
PAD_VALUE_MIN = 1_000_000
"""Token ids from here on are per-image pad values (SGLang, and Dynamo's worker-side form):
past every vocabulary."""
_MASK64 = (1 << 64) - 1
IMAGE_TOKEN = 0xFFFFFFFF
"""Stands for every image-run token in a shape."""

_digest = xxhash.xxh3_64_intdigest
_BIG_ENDIAN = sys.byteorder == "big"
if array("I").itemsize != 4:  # every platform CPython supports today has 4-byte unsigned int
    raise ImportError("content keys need a 4-byte array('I')")

try:  # the same chain compiled (``_chain.c``, built at install time when it can be)
    from mmlens.layout import _chain as native
except ImportError:
    native = None
if _BIG_ENDIAN:  # the compiled chain hashes native-order ids
    native = None


def u32_bytes(ids: Sequence[int]) -> bytes:
    """Little-endian u32 bytes of token ids (the keys must not depend on the machine)."""
    arr = array("I", ids)
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tobytes()

BlockImages = tuple[tuple[int, int], ...]
"""Per block: (image index, image start − block start) of each image overlapping it."""


def canonical_offset(offset: int | None) -> int:
    """An image's offset in a block as keys use it: −1 for an image that covers the block's
    first token (started there or earlier: the block before tells them apart), else its start.
    An engine that names an image's run by a pad value says no more than that."""
    return offset if offset is not None and offset > 0 else -1


def shape_step(parent: int, block: bytes, offsets: Sequence[int | None] = ()) -> int:
    """The shape key of a block (little-endian u32 token ids, image tokens masked) after
    ``parent`` (chained through the XXH3 seed), with its images' offsets."""
    if not offsets:
        return _digest(block, parent)
    arr = array("i", [canonical_offset(o) for o in offsets])
    if _BIG_ENDIAN:
        arr.byteswap()
    return _digest(block + arr.tobytes(), parent)


def identity_step(parent: int, identifiers: Sequence[str]) -> int:
    """The identity chain after a block holding images ``identifiers`` (unchanged without)."""
    if not identifiers:
        return parent
    return _digest("\x00".join(identifiers).encode(), parent)


def combine(shape: int, identity: int) -> int:
    """The content key of a block: its shape key while no image has been seen."""
    if identity == ROOT:
        return shape
    return _digest(shape.to_bytes(8, "little"), identity)


def state_key(state: int) -> int:
    """The content key of a block from its packed state (shape | identity << 64)."""
    return combine(state & _MASK64, state >> 64)


def block_images(view: View, block_size: int) -> list[BlockImages]:
    """Per full block of ``view``: the images overlapping it, by start. An image's range runs
    from its first image span's start to its last one's end (tiles with separators are one)."""
    ranges: dict[int, list[int]] = {}
    for span in view.spans:
        if span.kind is SpanKind.IMAGE and span.image_index is not None:
            ranges.setdefault(span.image_index, [span.start, span.end])[1] = span.end
    ordered = sorted(ranges.items(), key=lambda kv: kv[1][0])
    out: list[BlockImages] = []
    for start in range(0, len(view.token_ids) // block_size * block_size, block_size):
        end = start + block_size
        out.append(tuple((idx, a - start) for idx, (a, b) in ordered if a < end and b > start))
    return out


@dataclass(frozen=True, slots=True)
class BlockShapes:
    """A request's shape keys and the images of each full block: its content keys under any
    naming of its images."""

    shapes: tuple[int, ...]
    images: tuple[BlockImages, ...]

    def keys(self, identities: Sequence[str]) -> list[int]:
        """Content keys with image i named ``identities[i]``."""
        names = [name.encode() for name in identities]
        digest = _digest
        out: list[int] = []
        ident = ROOT
        for shape, imgs in zip(self.shapes, self.images, strict=True):
            if imgs:  # identity_step and combine, inlined: this runs per request and naming
                ident = digest(names[imgs[0][0]] if len(imgs) == 1 else
                               b"\x00".join(names[i] for i, _ in imgs), ident)
            out.append(shape if ident == ROOT else digest(shape.to_bytes(8, "little"), ident))
        return out

    def first_image_block(self, index: int) -> int | None:
        """The first block image ``index`` overlaps."""
        return self.first_blocks().get(index)

    def first_blocks(self) -> dict[int, int]:
        """Image index → the first block it overlaps."""
        out: dict[int, int] = {}
        for b, imgs in enumerate(self.images):
            for i, _ in imgs:
                out.setdefault(i, b)
        return out


def layout_shapes(view: View, block_size: int) -> BlockShapes:
    ids = list(view.token_ids)
    for span in view.spans:
        if span.kind is SpanKind.IMAGE:
            ids[span.start:span.end] = [IMAGE_TOKEN] * span.length
    images = block_images(view, block_size)
    raw = u32_bytes(ids[: len(images) * block_size])
    step = 4 * block_size
    shapes: list[int] = []
    parent = ROOT
    for b, imgs in enumerate(images):
        parent = shape_step(parent, raw[b * step:(b + 1) * step], [off for _, off in imgs])
        shapes.append(parent)
    return BlockShapes(tuple(shapes), tuple(images))


def content_block_keys(view: View, identities: Sequence[str], block_size: int) -> list[str]:
    """Content keys (16 hex) of ``view``'s full blocks with image i named ``identities[i]``."""
    return [f"{k:016x}" for k in layout_shapes(view, block_size).keys(identities)]


# --- the engine side ------------------------------------------------------------------------

EngineRefs = Sequence[tuple[str, int | None]]
"""One block's image refs from ``extra_keys``: (identifier, offset in the block)."""


def masked_block(tokens: Sequence[int], refs: EngineRefs) -> bytes:
    """A block's token bytes with its images' run tokens masked: the token each image starts
    (or continues) with in this block stands for that image's run."""
    n = len(tokens)
    run = {tokens[max(off or 0, 0)] for _, off in refs if max(off or 0, 0) < n}
    if len(run) == 1 and tokens.count(next(iter(run))) == n:
        return _MASKED.get(n) or _MASKED.setdefault(n, u32_bytes([IMAGE_TOKEN] * n))
    return u32_bytes([IMAGE_TOKEN if t in run else t for t in tokens])


_MASKED: dict[int, bytes] = {}


def pad_images(tokens: Sequence[int], block_size: int,
               ) -> list[tuple[tuple[str, int], ...] | None] | None:
    """Per block, the images of an event whose images are named only by the pad values that
    fill their runs (SGLang): one ``pad:<value>`` per value, at its first position in the
    block; None when no token is a pad value."""
    if not tokens or max_token(tokens) < PAD_VALUE_MIN:
        return None
    out: list[tuple[tuple[str, int], ...] | None] = []
    for lo in range(0, len(tokens) // block_size * block_size, block_size):
        firsts: dict[int, int] = {}
        for pos, t in enumerate(tokens[lo:lo + block_size]):
            if t >= PAD_VALUE_MIN and t not in firsts:
                firsts[t] = pos
        out.append(tuple((f"pad:{t}", canonical_offset(p)) for t, p in firsts.items()) or None)
    return out


def max_token(tokens: Sequence[int]) -> int:
    """The largest token id (``tokens`` not empty)."""
    if native is not None and type(tokens) is array:
        return native.max_u32(tokens)
    return max(tokens)


def event_chain(state: int, tokens: Sequence[int], block_size: int,
                images: Sequence[EngineRefs | None] | None,
                ) -> tuple[list[int], list[int], list[int]]:
    """Per block of one ``BlockStored`` event: content state, shape key and content key,
    continuing from its parent block's state (``ROOT`` for the first block of a sequence).

    A state packs a block's shape and identity chains as shape | identity << 64.
    """
    if native is None:
        return event_chain_py(state, tokens, block_size, images)
    if type(tokens) is not array:
        tokens = array("I", tokens)
    return native.event_chain(tokens, block_size, state & _MASK64, state >> 64, images)


def event_chain_py(state: int, tokens: Sequence[int], block_size: int,
                   images: Sequence[EngineRefs | None] | None,
                   ) -> tuple[list[int], list[int], list[int]]:
    """``event_chain`` in Python (no compiled module): the form the compiled one must equal."""
    raw = u32_bytes(tokens)
    step = 4 * block_size
    n = len(tokens) // block_size
    shape, ident = state & _MASK64, state >> 64
    if not images and ident == ROOT:  # text after text: all three coincide
        shapes = []
        for lo in range(0, n * step, step):
            shape = _digest(raw[lo:lo + step], shape)
            shapes.append(shape)
        return shapes, shapes, shapes
    imgs = images or ()
    n_imgs = len(imgs)
    digest = _digest
    # The common image block: its run's token over the whole block, the image begun at or
    # before its start (canonical offset -1): one constant shape input per block size.
    covered = _COVERED.get(block_size) or _COVERED.setdefault(
        block_size, u32_bytes([IMAGE_TOKEN] * block_size) + _NO_START)
    names: dict[str, bytes] = {}
    states, shapes, keys = [], [], []
    for b in range(n):
        refs = imgs[b] if b < n_imgs else None
        lo = b * step
        if refs:
            if len(refs) == 1:  # one image in the block: the generic steps, inlined
                name, off = refs[0]
                block = raw[lo:lo + step]
                if (off is None or off <= 0) and block == block[:4] * block_size:
                    shape = digest(covered, shape)
                else:
                    block = masked_block(tokens[b * block_size:(b + 1) * block_size], refs)
                    shape = digest(block + canonical_offset(off).to_bytes(4, "little",
                                                                          signed=True), shape)
                encoded = names.get(name)
                if encoded is None:
                    encoded = names[name] = name.encode()
                ident = digest(encoded, ident)
            else:
                block = masked_block(tokens[b * block_size:(b + 1) * block_size], refs)
                shape = shape_step(shape, block, [off for _, off in refs])
                ident = identity_step(ident, [i for i, _ in refs])
        else:
            shape = digest(raw[lo:lo + step], shape)
        shapes.append(shape)
        if ident == ROOT:
            states.append(shape)
            keys.append(shape)
        else:
            states.append(shape | ident << 64)
            keys.append(digest(shape.to_bytes(8, "little"), ident))
    return states, shapes, keys


_COVERED: dict[int, bytes] = {}
_NO_START = (-1).to_bytes(4, "little", signed=True)
