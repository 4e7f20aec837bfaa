"""Synthetic images for a replay: one PNG per recorded image identity, of the recorded size.

The bytes are a function of (identity, width, height) alone: the same identity always gets
the same bytes, so an engine that keys its cache on image content (vLLM's pixel hash, SMG's
blake3 of the bytes, Dynamo's hash of the data URL) sees a repeat as a repeat; a different
identity gets different bytes because the identity's SHA-256 is written into the first
pixels (3 bytes a pixel, row by row), not just into a colour that could collide. The rest is
one flat colour, so a large image stays a small PNG to send.
"""

from __future__ import annotations

import hashlib
import io
from functools import lru_cache

DIGEST_PIXELS = 11  # ceil(32 / 3): a SHA-256 digest, 3 bytes a pixel


def identity_digest(identity: str) -> bytes:
    return hashlib.sha256(identity.encode()).digest()


def identity_png(identity: str, width: int, height: int) -> bytes:
    """A ``width`` x ``height`` PNG that only ``identity`` maps to (an image under 11 pixels
    carries only as much of the digest as it has pixels)."""
    from PIL import Image

    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    digest = identity_digest(identity)
    img = Image.new("RGB", (width, height), (digest[0], digest[1], digest[2]))
    padded = digest + bytes(3 * DIGEST_PIXELS - len(digest))
    for i in range(min(DIGEST_PIXELS, width * height)):
        img.putpixel((i % width, i // width), tuple(padded[3 * i:3 * i + 3]))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@lru_cache(maxsize=1024)
def cached_identity_png(identity: str, width: int, height: int) -> bytes:
    """``identity_png``, made once per image (a replay sends each identity many times)."""
    return identity_png(identity, width, height)
