"""The layout mmlens expected for a request, as the record stored with its trace.

``mmlens.layout.report.layout_summary`` computes it as a dict (the ``mmlens layout --json``
shape); ``ExpectedLayout.from_summary`` makes it this record and ``to_json`` gives the same
dict back, so stored rows and printed JSON keep the summary's fields and order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import msgspec

_NAMES: dict[type, tuple[str, ...]] = {}


def _set_fields(record: Any) -> dict[str, Any]:
    """A dataclass's fields in order, without those that are None."""
    names = _NAMES.get(type(record))
    if names is None:
        names = _NAMES[type(record)] = tuple(f.name for f in fields(record))
    return {name: v for name in names if (v := getattr(record, name)) is not None}


@dataclass(slots=True)
class LayoutImage:
    """One image of an expected layout: its size, token counts and identities."""

    width: int
    height: int
    tokens: int
    expanded_length: int | None = None
    engine_tokens: int | None = None
    identity: dict[str, str | int | None] = field(default_factory=dict)


@dataclass(slots=True)
class LayoutSpan:
    """A run of the router view: ``kind`` is a ``SpanKind`` value (text, image, anchor…)."""

    kind: str
    start: int
    length: int
    image_index: int | None = None


@dataclass(slots=True)
class ViewCount:
    token_count: int
    full_blocks: int | None = None
    partial_block_tokens: int | None = None

    def to_json(self) -> dict[str, int]:
        return _set_fields(self)


@dataclass(slots=True)
class LayoutPart:
    """One content part as a request listed it, without its content: a text part by its
    length in characters, an image by its index (the tap's part layout)."""

    kind: str
    index: int | None = None
    chars: int | None = None

    def to_json(self) -> dict[str, Any]:
        return _set_fields(self)


@dataclass(slots=True)
class ExpectedLayout:
    """The layout mmlens expected for a request (``mmlens.layout.report.layout_summary``),
    stored with its trace: counts, router-view spans, per-block content keys and image
    identities — enough for the inspector and the explainer without the prompt text.

    ``text`` and ``layout_model`` are kept only when the sender opted in to storing prompt
    text (they let the inspector rebuild every view's token ids). ``error`` alone says why no
    layout could be computed.
    """

    family: str | None = None
    block_size: int = 16
    tokenizer: str | None = None
    synthetic_tokenizer: bool = False
    images: list[LayoutImage] = field(default_factory=list)
    anchor_view: ViewCount | None = None
    router_view: ViewCount | None = None
    worker_view: ViewCount | None = None
    engine_prompt_tokens: int | None = None
    first_divergent_block: int | None = None
    spans: list[LayoutSpan] = field(default_factory=list)
    routers: dict[str, dict[str, Any]] = field(default_factory=dict)
    block_keys: list[str] | None = None
    # The keys' identity-free half per block, and each block's images as
    # [block, [[image index, offset], …]]: the keys under an engine's names for the images.
    block_shapes: list[str] | None = None
    block_images: list[list[Any]] | None = None
    parts: list[LayoutPart] | None = None  # the request's parts when no token layout is known
    text: str | None = None
    layout_model: str | None = None
    error: str | None = None

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> ExpectedLayout:
        """From ``layout_summary``'s dict (or a stored one, with or without text)."""
        return msgspec.convert(summary, cls, strict=False)

    @classmethod
    def failed(cls, message: str) -> ExpectedLayout:
        return cls(error=message)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        """The summary's own JSON shape (what ``mmlens layout --json`` prints), plus
        ``text``/``layout_model`` when kept; a failed layout is ``{"error": …}``."""
        if not self.ok:
            return {"error": self.error}
        if self.router_view is None and self.family is None:  # parts only (the tap)
            return self._tail({})
        out: dict[str, Any] = {
            "family": self.family, "block_size": self.block_size, "tokenizer": self.tokenizer,
            "synthetic_tokenizer": self.synthetic_tokenizer,
            "images": [asdict(im) for im in self.images],
            "anchor_view": None if self.anchor_view is None else self.anchor_view.to_json(),
            "router_view": None if self.router_view is None else self.router_view.to_json(),
            "worker_view": None if self.worker_view is None else self.worker_view.to_json(),
            "engine_prompt_tokens": self.engine_prompt_tokens,
            "first_divergent_block": self.first_divergent_block,
            "spans": [asdict(s) for s in self.spans],
            "routers": self.routers,
        }
        if self.block_keys is not None:
            out["block_keys"] = list(self.block_keys)
        if self.block_shapes is not None:
            out["block_shapes"] = list(self.block_shapes)
            out["block_images"] = list(self.block_images or [])
        return self._tail(out)

    def _tail(self, out: dict[str, Any]) -> dict[str, Any]:
        if self.parts is not None:
            out["parts"] = [p.to_json() for p in self.parts]
        if self.text is not None:
            out["text"] = self.text
        if self.layout_model is not None:
            out["layout_model"] = self.layout_model
        return out
