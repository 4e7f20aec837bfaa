"""Worker-side media handling: fetch, decode and identify images as a vLLM worker does.

Identifiers follow vLLM's scheme, not the router's: blake3 over the model id and the decoded
RGBA pixels (64 hex), so router-mode and worker-mode identifiers for one image differ.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlparse

import blake3
import httpx
from PIL import Image, UnidentifiedImageError

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_PIXELS = 4096 * 4096  # decoded RGBA: 64 MB at most (8192² was ~1 GB in all)
DEFAULT_DEADLINE_S = 5.0


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


def allowed(url: str, allowed_hosts: frozenset[str]) -> None:
    """Only ``host:port`` entries (``host:*`` opens every port of a host, by explicit choice;
    a bare host means its scheme's default port)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https"):
        raise MediaError(f"media URL scheme {parsed.scheme!r} not accepted")
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError:
        raise MediaError("media URL has an invalid port") from None
    host = parsed.hostname or ""
    entries = {f"{host}:{port}", f"{host}:*"}
    if port == (443 if parsed.scheme == "https" else 80):
        entries.add(host)
    if not entries & allowed_hosts:
        raise MediaError(f"media host {host}:{port} is not in the allowed hosts")


def fetch_bytes(url: str, allowed_hosts: frozenset[str], max_bytes: int,
                deadline_s: float = DEFAULT_DEADLINE_S) -> bytes:
    if url.startswith("data:"):
        if len(url) > max_bytes * 4 // 3 + 256:
            raise MediaError(f"image larger than {max_bytes} bytes")
        data = _data_url_bytes(url)
    else:
        allowed(url, allowed_hosts)
        data = _get(url, max_bytes, deadline_s)
    if len(data) > max_bytes:
        raise MediaError(f"image larger than {max_bytes} bytes")
    return data


def _get(url: str, max_bytes: int, deadline_s: float) -> bytes:
    """One GET within ``deadline_s`` in all (a slow drip is cut off), no redirects, at most
    ``max_bytes``; every failure is a MediaError (the API answers 400, not 500)."""
    deadline = time.monotonic() + deadline_s
    try:
        with httpx.stream("GET", url, timeout=deadline_s, follow_redirects=False) as resp:
            if resp.is_redirect:
                raise MediaError(f"media URL redirects ({resp.status_code}); not followed")
            if resp.status_code != 200:
                raise MediaError(f"media server answered HTTP {resp.status_code}")
            declared = resp.headers.get("content-length", "")
            if declared.isdigit() and int(declared[:20]) > max_bytes:
                raise MediaError(f"image larger than {max_bytes} bytes")
            chunks, size = [], 0
            for chunk in resp.iter_bytes():
                size += len(chunk)
                if size > max_bytes:
                    raise MediaError(f"image larger than {max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise MediaError(f"media fetch took longer than {deadline_s:g} s")
                chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise MediaError(f"media fetch failed: {type(exc).__name__}") from None
    return b"".join(chunks)


def decode_image(
    url: str,
    model_id: str,
    allowed_hosts: frozenset[str] = frozenset(),
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> DecodedImage:
    data = fetch_bytes(url, allowed_hosts, max_bytes, deadline_s)
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if width * height > max_pixels:
                raise MediaError(f"image of {width}x{height} pixels exceeds {max_pixels}")
            rgba = img.convert("RGBA").tobytes()
    except UnidentifiedImageError as exc:
        raise MediaError("cannot decode image: unrecognized image data") from exc
    except (OSError, ValueError, SyntaxError, EOFError, struct.error,
            Image.DecompressionBombError) as exc:  # what Pillow raises for broken files
        raise MediaError(f"cannot decode image: {exc}") from exc
    h = blake3.blake3(model_id.encode())
    h.update(f"{width}x{height}".encode())
    h.update(rgba)
    return DecodedImage(width, height, h.hexdigest(), len(data))


# Fetches and decodes get threads of their own: slow media servers cannot take the event
# loop's default executor from the rest of the worker.
_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="media")


async def decode_async(url: str, model_id: str, allowed_hosts: frozenset[str] = frozenset(),
                       max_bytes: int = DEFAULT_MAX_BYTES,
                       max_pixels: int = DEFAULT_MAX_PIXELS) -> DecodedImage:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, decode_image, url, model_id, allowed_hosts,
                                      max_bytes, max_pixels)
