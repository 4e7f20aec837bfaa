"""Worker-side media handling: fetch, decode and identify images as a vLLM worker does.

Identifiers follow vLLM's scheme, not the router's: blake3 over the model id and the decoded
RGBA pixels (64 hex), so router-mode and worker-mode identifiers for one image differ.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from urllib.parse import urlparse

import blake3
import httpx
from PIL import Image, UnidentifiedImageError

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_PIXELS = 64 * 1024 * 1024


class MediaError(ValueError):
    """An image the worker refuses: bad URL, undecodable, oversize or from a disallowed host."""


@dataclass(frozen=True)
class DecodedImage:
    width: int
    height: int
    identifier: str
    nbytes: int


def _data_url_bytes(url: str) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.startswith("data:"):
        raise MediaError("malformed data URL")
    if not header.endswith(";base64"):
        raise MediaError("data URL must be base64-encoded")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MediaError(f"invalid base64 in data URL: {exc}") from exc


def fetch_bytes(url: str, allowed_hosts: frozenset[str], max_bytes: int) -> bytes:
    if url.startswith("data:"):
        if len(url) > max_bytes * 4 // 3 + 256:
            raise MediaError(f"image larger than {max_bytes} bytes")
        data = _data_url_bytes(url)
    else:
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https"):
            raise MediaError(f"media URL scheme {parsed.scheme!r} not accepted")
        if parsed.hostname not in allowed_hosts:
            raise MediaError(f"media host {parsed.hostname!r} is not in the allowed hosts")
        with httpx.stream("GET", url, timeout=10.0) as resp:
            resp.raise_for_status()
            chunks, size = [], 0
            for chunk in resp.iter_bytes():
                size += len(chunk)
                if size > max_bytes:
                    raise MediaError(f"image larger than {max_bytes} bytes")
                chunks.append(chunk)
        data = b"".join(chunks)
    if len(data) > max_bytes:
        raise MediaError(f"image larger than {max_bytes} bytes")
    return data


def decode_image(
    url: str,
    model_id: str,
    allowed_hosts: frozenset[str] = frozenset(),
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> DecodedImage:
    data = fetch_bytes(url, allowed_hosts, max_bytes)
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if width * height > max_pixels:
                raise MediaError(f"image of {width}x{height} pixels exceeds {max_pixels}")
            rgba = img.convert("RGBA").tobytes()
    except UnidentifiedImageError as exc:
        raise MediaError("cannot decode image: unrecognized image data") from exc
    except (OSError, Image.DecompressionBombError) as exc:
        raise MediaError(f"cannot decode image: {exc}") from exc
    h = blake3.blake3(model_id.encode())
    h.update(f"{width}x{height}".encode())
    h.update(rgba)
    return DecodedImage(width, height, h.hexdigest(), len(data))
