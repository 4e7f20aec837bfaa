"""Image sizes from encoded bytes (header only where the format allows), and data: URLs."""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from dataclasses import dataclass

import pybase64

from mmlens.errors import ImageError
from mmlens.layout.image_tokens import MAX_SIDE, check_size

MAX_IMAGE_BYTES = 20 * 1024 * 1024
FORMATS = {"PNG", "JPEG", "GIF", "WEBP", "BMP"}
SIZE_RE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")
DATA_URL_RE = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*),", re.S)


@dataclass(frozen=True, slots=True)
class ImageInfo:
    width: int
    height: int
    format: str
    nbytes: int


def parse_size(text: str) -> tuple[int, int]:
    """"640x480" → (640, 480)."""
    m = SIZE_RE.match(text)
    if not m:
        raise ImageError(f"not an image size WxH: {text[:80]!r}")
    if max(len(m.group(1)), len(m.group(2))) > 6:  # int() of thousands of digits is slow
        raise ImageError(f"image size {text[:40]!r}… exceeds the {MAX_SIDE} px limit")
    width, height = int(m.group(1)), int(m.group(2))
    check_size(width, height)
    return width, height


def probe_image(data: bytes, max_bytes: int = MAX_IMAGE_BYTES) -> ImageInfo:
    """Width, height and format from the header; refuses non-images and truncated files."""
    if not data:
        raise ImageError("empty image data")
    if len(data) > max_bytes:
        raise ImageError(f"image is {len(data)} bytes, over the {max_bytes} byte limit")
    from PIL import Image, UnidentifiedImageError  # here: a size given as WxH needs no PIL

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            width, height = img.size
            fmt = img.format or "?"
    except (UnidentifiedImageError, Image.DecompressionBombWarning,
            Image.DecompressionBombError) as exc:
        raise ImageError(f"not a readable image ({len(data)} bytes): {exc}") from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageError(f"truncated or corrupt image header: {exc}") from exc
    if fmt not in FORMATS:
        raise ImageError(f"unsupported image format {fmt}; accepted: {', '.join(sorted(FORMATS))}")
    check_truncation(data, fmt)
    check_size(width, height)
    return ImageInfo(width, height, fmt, len(data))


def check_truncation(data: bytes, fmt: str) -> None:
    """Cheap end-of-file checks that need no pixel decoding."""
    if fmt == "JPEG":
        if not data.rstrip(b"\x00").endswith(b"\xff\xd9"):
            raise ImageError("truncated JPEG: no end-of-image marker")
        return
    if fmt == "PNG":
        if b"IEND" not in data[-32:]:
            raise ImageError("truncated PNG: no IEND chunk")
        from PIL import Image

        try:
            Image.open(io.BytesIO(data)).verify()
        except Exception as exc:
            raise ImageError(f"corrupt PNG: {exc}") from exc


def decode_data_url(url: str, max_bytes: int = MAX_IMAGE_BYTES) -> bytes:
    m = DATA_URL_RE.match(url)
    if not m:
        raise ImageError("not a data: URL")
    payload = url[m.end():]
    if len(payload) * 3 // 4 > max_bytes:
        raise ImageError(f"data: URL payload is over the {max_bytes} byte limit")
    if ";base64" not in (m.group("params") or ""):
        raise ImageError("data: URL is not base64-encoded")
    try:
        return pybase64.b64decode(payload, validate=True)  # SIMD: ~10× binascii
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"data: URL has invalid base64: {exc}") from exc


def to_data_url(data: bytes, fmt: str) -> str:
    mime = "image/jpeg" if fmt.upper() == "JPEG" else f"image/{fmt.lower()}"
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def decoded_rgb(data: bytes) -> bytes:
    """Raw RGB pixels, what Dynamo's frontend-decoding mode hashes for an image's identity."""
    from PIL import Image

    probe_image(data)
    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB").tobytes()
