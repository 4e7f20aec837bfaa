"""mmlens' test images put on a configured media origin (``media_origin``: a server the
cluster's workers fetch from, such as the demo's), so URL-image requests work with workers
that fetch only from allowed hosts."""

from __future__ import annotations

import hashlib
from urllib.parse import quote

import httpx


class MediaOriginError(RuntimeError):
    """The media origin refused an upload or could not be reached."""


def upload(client: httpx.Client, origin: str, data: bytes, name: str,
           timeout_s: float = 10.0) -> str:
    """PUT ``data`` at ``<origin>/media/<sha256>`` and return its URL under ``name``
    (``<origin>/media/<sha256>/<name>``: one image can have several URLs)."""
    sha = hashlib.sha256(data).hexdigest()
    base = origin.rstrip("/")
    try:
        resp = client.put(f"{base}/media/{sha}", content=data, timeout=timeout_s,
                          headers={"Content-Type": "application/octet-stream"})
    except httpx.HTTPError as exc:
        raise MediaOriginError(f"media origin {base} is unreachable: {exc}") from None
    if resp.status_code not in (200, 201):
        try:
            why = str(resp.json().get("error"))
        except (ValueError, AttributeError):
            why = resp.text[:200]
        raise MediaOriginError(f"media origin {base} refused the upload "
                               f"(HTTP {resp.status_code}): {why}")
    return f"{base}/media/{sha}/{quote(name.strip('/') or 'image', safe='.-_')}"
