"""Image identity and block hashes under each router's scheme.

- Dynamo: mm_hash = XXH3-64 of the URL string (a data: URI hashed whole), or of the decoded
  RGB bytes with frontend decoding; the image's run is replaced by the pad value
  1_000_000 + (mm_hash & (2^30 − 1)); the routing ids are zero-padded to a block multiple
  and every block is hashed with XXH3-64, seed 1337, over little-endian u32 ids.
- SMG: the item identifier is the blake3 hex of the raw encoded bytes; SMG 1.13 re-keys it
  for families that composite transparent images over white (Qwen3-VL, GLM-5.3-Flash; see
  `smg_identity`). Its cache-aware block hashes cover token ids only, so two images with the
  same N collide.
- vLLM: placeholder ids stay identical for all images; a block overlapping an image carries
  `extra_keys` entries (identifier, image offset − block start).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import xxhash
from blake3 import blake3

from mmlens.errors import LayoutError
from mmlens.layout.composition import Layout, SpanKind, View
from mmlens.layout.content_keys import block_images, u32_bytes

XXH3_SEED = 1337
PAD_SHIFT = 1_000_000
PAD_MASK = (1 << 30) - 1


def dynamo_mm_hash_url(url: str) -> int:
    return xxhash.xxh3_64_intdigest(url.encode())


def dynamo_mm_hash_decoded(rgb: bytes) -> int:
    return xxhash.xxh3_64_intdigest(rgb)


def dynamo_pad_value(mm_hash: int) -> int:
    return PAD_SHIFT + (mm_hash & PAD_MASK)


def dynamo_hash_hex(mm_hash: int) -> str:
    """The 16-hex form Dynamo forwards to workers in `mm_hashes`."""
    return f"{mm_hash:016x}"


def smg_identifier(data: bytes) -> str:
    return blake3(data).hexdigest()


SMG_PARAMS_TAG = b"smg.media.params.v1"


def smg_identity(data: bytes, transparency: str | None = None) -> str:
    """The identifier SMG 1.13 forwards (`mm_hashes`) for one image's encoded bytes.

    Without a transparency policy (Kimi-K3) it is the blake3 hex of the bytes. With one
    (Qwen3-VL and GLM-5.3-Flash use "composite_over_white") that hex is hashed again as
    blake3(tag ‖ u64-LE length of the hex ‖ hex ‖ policy name), so pixels and bytes alone do
    not give it. Found in the 1.13 binary and checked against every identity it forwarded.
    """
    return smg_identity_of_digest(smg_identifier(data), transparency)


def smg_identity_of_digest(digest: str, transparency: str | None = None) -> str:
    """`smg_identity` from the blake3 hex of the bytes."""
    if transparency is None:
        return digest
    hexed = digest.encode()
    return blake3(SMG_PARAMS_TAG + len(hexed).to_bytes(8, "little") + hexed
                  + transparency.encode()).hexdigest()


def block_hashes(ids: Sequence[int], block_size: int, seed: int = XXH3_SEED) -> list[int]:
    """XXH3-64 of each complete block's little-endian u32 ids; a partial tail is skipped."""
    if block_size <= 0:
        raise LayoutError(f"block size must be positive, got {block_size}")
    full = len(ids) // block_size * block_size
    if not full:
        return []
    raw = u32_bytes(ids[:full])
    step = block_size * 4
    digest = xxhash.xxh3_64_intdigest
    return [digest(raw[i:i + step], seed) for i in range(0, len(raw), step)]


@dataclass(frozen=True, slots=True)
class DynamoRouting:
    routing_ids: tuple[int, ...]  # zero-padded to a block multiple
    expanded_prompt_len: int
    mm_hashes: tuple[int, ...]
    pad_values: tuple[int, ...]
    block_hashes: tuple[int, ...]


def dynamo_routing(
    layout: Layout, mm_hashes: Sequence[int], bos_id: int | None = None
) -> DynamoRouting:
    """Dynamo's router-only view: image runs become per-image pad values."""
    view = layout.router
    if len(mm_hashes) != len(layout.images):
        raise LayoutError(f"{len(mm_hashes)} mm_hash(es) for {len(layout.images)} image(s)")
    ids = list(view.token_ids)
    pads = [dynamo_pad_value(h) for h in mm_hashes]
    for span in view.spans:
        if span.kind is SpanKind.IMAGE and span.image_index is not None:
            ids[span.start:span.end] = [pads[span.image_index]] * span.length
    if bos_id is not None:
        ids.insert(0, bos_id)
    expanded = len(ids)
    bs = layout.block_size
    ids.extend([0] * (-expanded % bs))
    return DynamoRouting(tuple(ids), expanded, tuple(mm_hashes), tuple(pads),
                         tuple(block_hashes(ids, bs)))


def smg_block_hashes(layout: Layout) -> list[int]:
    """SMG's event-driven block hashes: token ids only, full blocks only (content-blind)."""
    return block_hashes(layout.router.token_ids, layout.block_size)


ExtraKeys = tuple[tuple[str, int], ...] | None


def vllm_extra_keys(view: View, identifiers: Sequence[str], block_size: int) -> list[ExtraKeys]:
    """Per full block: (identifier, image offset − block start) for each overlapping image.

    An image spanning 4..67 at block size 16 gives block 0 (id, 4), block 1 (id, −12), …
    """
    if len(identifiers) and not view.spans:
        raise LayoutError("view has no spans")
    per_block = block_images(view, block_size)
    n_images = len({s.image_index for s in view.spans
                    if s.kind is SpanKind.IMAGE and s.image_index is not None})
    if n_images != len(identifiers):
        raise LayoutError(f"{len(identifiers)} identifier(s) for {n_images} image(s)")
    return [tuple((identifiers[idx], off) for idx, off in imgs) or None for imgs in per_block]
