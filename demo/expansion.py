"""Worker-side placeholder expansion: one anchor per image becomes the family's image block.

The worker uses its own processor settings (its model directory's processor config) plus an
optional `count_drift`, which makes its N differ from the router's on purpose.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mmlens.demo.media import DecodedImage
from mmlens.demo.model_dirs import DemoModel
from mmlens.demo.prefix_cache import MediaSpan

from mmlens.layout.families import Expansion


class PlaceholderMismatch(ValueError):
    """The prompt's anchors and the request's images disagree."""


@dataclass
class Expander:
    model: DemoModel
    processor_config: dict[str, Any]
    encode_text: Callable[[str], list[int]]
    count_drift: int = 0

    @property
    def anchor_id(self) -> int:
        return self.model.token_id(self.model.core.anchor)

    def image_tokens(self, width: int, height: int) -> int:
        n = self.model.core.image_token_count(width, height, self.processor_config)
        return max(1, n + self.count_drift)

    def block(self, image: DecodedImage) -> tuple[list[int], int, int]:
        """Ids replacing one anchor, and the (start, length) of its placeholder range."""
        n = self.image_tokens(image.width, image.height)
        core = self.model.core
        pad = self.model.token_id(core.pad)
        if core.expansion is Expansion.KIMI_K3:
            # <|media_begin|> "image WxH" <|media_content|> pad*N <|media_end|>, one range.
            tid = self.model.token_id
            dims = self.encode_text(f"image {image.width}x{image.height}")
            ids = [tid("<|media_begin|>"), *dims, tid("<|media_content|>"), *([pad] * n),
                   tid("<|media_end|>")]
            return ids, 0, len(ids)
        return [pad] * n, 0, n

    def expand(
        self, ids: Sequence[int], images: Sequence[DecodedImage]
    ) -> tuple[list[int], list[MediaSpan]]:
        anchors = [i for i, t in enumerate(ids) if t == self.anchor_id]
        if len(anchors) != len(images):
            raise PlaceholderMismatch(
                f"multimodal placeholder validation failed: {len(anchors)} placeholders "
                f"for {len(images)} images")
        out: list[int] = []
        spans: list[MediaSpan] = []
        prev = 0
        for pos, image in zip(anchors, images, strict=True):
            out.extend(ids[prev:pos])
            block, start, length = self.block(image)
            spans.append(MediaSpan(image.identifier, len(out) + start, length))
            out.extend(block)
            prev = pos + 1
        out.extend(ids[prev:])
        return out, spans
