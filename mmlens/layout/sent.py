"""What a request sent, as its trace keeps it: each image's size and identities (probed once,
identities from ``mmlens.layout.hashing``) and the layout mmlens expected for it.

Every traffic source describes its images here: mmlens' own senders (through the collectors'
trace sink) and the tap, which sees requests mmlens did not send.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

from mmlens.errors import ImageError, LayoutError
from mmlens.layout.composition import ImageInput
from mmlens.layout.expected import ExpectedLayout
from mmlens.layout.hashing import dynamo_hash_hex, dynamo_mm_hash_url, smg_identifier
from mmlens.layout.imageinfo import probe_image
from mmlens.layout.modeldir import Model
from mmlens.layout.report import layout_summary
from mmlens.records import ImageInfo


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image to send: raw bytes (sent as a data: URL) or an http(s) URL passed through."""

    data: bytes | None = None
    url: str | None = None
    mime: str = "image/png"

    def as_url(self) -> str:
        if self.url is not None:
            return self.url
        if self.data is None:
            raise ImageError("an image part needs bytes or a URL")
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode()}"


@dataclass(frozen=True, slots=True)
class SentImage:
    """An image as sent: what the trace records of it, and its layout input when its size is
    known (``None`` for a URL mmlens did not fetch, or bytes that are no readable image)."""

    info: ImageInfo
    layout_input: ImageInput | None = None
    error: str | None = None  # why the bytes are no readable image


def identities(url: str, data: bytes | None) -> dict[str, str]:
    """An image's identity under each router's scheme: Dynamo's hash of the URL string,
    SMG's blake3 of the bytes (when known)."""
    ids = {"dynamo_mm_hash_url": dynamo_hash_hex(dynamo_mm_hash_url(url))}
    if data is not None:
        ids["smg_blake3"] = smg_identifier(data)
    return ids


def describe_image(url: str, data: bytes | None) -> SentImage:
    """``url`` as it went to the router; ``data`` its bytes when known (a data: URL decoded,
    or the bytes behind an http URL mmlens serves itself)."""
    ids = identities(url, data)
    if data is None:
        kind = "data" if url.startswith("data:") else "http"
        return SentImage(ImageInfo(kind, identities=ids))
    info = ImageInfo("data", byte_size=len(data), identities=ids)
    try:
        probed = probe_image(data)
    except ImageError as exc:  # still sent: the router will say what it thinks of them
        return SentImage(info, error=str(exc))
    info.width, info.height = probed.width, probed.height
    return SentImage(info, ImageInput(probed.width, probed.height, data=data, url=url,
                                      format=probed.format))


def describe_parts(parts: Sequence[ImagePart]) -> list[SentImage]:
    return [describe_image(p.as_url(), p.data) for p in parts]


def expected_layout(model: Model, text: str, images: Sequence[SentImage], block_size: int,
                    ) -> ExpectedLayout | None:
    """The layout of ``text`` after ``images`` (None when an image's size is unknown); a
    request the core refuses gets a layout that says why."""
    bad = next((im.error for im in images if im.error is not None), None)
    if bad is not None:
        return ExpectedLayout.failed(f"ImageError: {bad}")
    inputs = [im.layout_input for im in images]
    if any(i is None for i in inputs):
        return None
    known = [i for i in inputs if i is not None]
    try:
        layout = model.layout([*known, text], block_size=block_size)
        return ExpectedLayout.from_summary(layout_summary(layout, model.family, known))
    except (LayoutError, ValueError) as exc:
        return ExpectedLayout.failed(f"{type(exc).__name__}: {exc}")
