"""An image's width and height read from its first bytes alone (PNG, JPEG, GIF, WebP, BMP),
for paths that must not decode anything: the tap records every image it sees. A header this
cannot read returns None, and the caller probes the image fully (``imageinfo.probe_image``),
which also says why an image is refused."""

from __future__ import annotations

import struct

from mmlens.errors import ImageError
from mmlens.layout.image_tokens import check_size

# JPEG start-of-frame markers: every SOFn but DHT (C4), JPG (C8) and DAC (CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the header, None when it cannot tell (or the size is refused)."""
    try:
        size = _size(data)
        if size is not None:
            check_size(*size)
        return size
    except (struct.error, IndexError, ImageError):
        return None


def _size(data: bytes) -> tuple[int, int] | None:
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        if b"IEND" not in data[-32:]:
            return None  # truncated: the full probe says so
        w, h = struct.unpack(">II", data[16:24])
        return w, h
    if data[:2] == b"\xff\xd8":
        if not data.rstrip(b"\x00").endswith(b"\xff\xd9"):
            return None
        return _jpeg(data)
    if data[:6] in (b"GIF87a", b"GIF89a"):
        w, h = struct.unpack("<HH", data[6:10])
        return w, h
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp(data)
    if data[:2] == b"BM":
        w, h = struct.unpack("<ii", data[18:26])
        return w, abs(h)
    return None


def _jpeg(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            i += 2
            continue
        length = struct.unpack(">H", data[i + 2:i + 4])[0]
        if marker in _SOF:
            h, w = struct.unpack(">HH", data[i + 5:i + 9])
            return w, h
        i += 2 + length
    return None


def _webp(data: bytes) -> tuple[int, int] | None:
    kind = data[12:16]
    if kind == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if kind == b"VP8L" and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8X":
        return (int.from_bytes(data[24:27], "little") + 1,
                int.from_bytes(data[27:30], "little") + 1)
    return None
