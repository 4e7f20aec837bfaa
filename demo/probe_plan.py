"""What the router probes send: random image sizes by kind, multi-part messages and
processor-config variants, all deterministic from a seed.

Sizes come in kinds that stress different parts of the formulas: tiny (a side under the patch
grid), ordinary, skinny (aspect 50..200), extreme (aspect over 200, which the HF processors
refuse), large and huge (the max-pixel budget bites). Huge images are few: SMG's router mode
ships their pixel tensors to the worker (hundreds of MB each).
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from typing import Any

from mmlens.layout.imageinfo import to_data_url

# kind -> (count, side range); skinny/extreme sizes are drawn by aspect instead.
PLAN: dict[str, tuple[int, tuple[int, int]]] = {
    "tiny": (30, (1, 40)),
    "small": (30, (41, 300)),
    "medium": (90, (301, 2500)),
    "skinny": (20, (1, 6000)),
    "extreme": (15, (1, 12000)),
    "large": (20, (2501, 5000)),
    "huge": (6, (5001, 8192)),
}

# A fixed set for processor-config variants: both budget edges and the ordinary middle.
VARIANT_SIZES: tuple[tuple[int, int], ...] = (
    (16, 16), (28, 28), (32, 32), (64, 64), (100, 100), (16, 256), (112, 112), (224, 224),
    (300, 1000), (500, 375), (640, 480), (1000, 700), (1024, 768), (1280, 720), (1600, 1200),
    (1920, 1080), (2048, 2048), (2281, 24), (2560, 1440), (3000, 2000), (3840, 2160),
    (4000, 3000), (5000, 5000),
)


@dataclass(frozen=True)
class SizeCase:
    kind: str
    width: int
    height: int

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "w": self.width, "h": self.height}


def _skinny(rng: random.Random, low: float, high: float, side_max: int) -> tuple[int, int]:
    while True:
        short = rng.randint(1, 60)
        long = int(short * rng.uniform(low, high))
        if 1 <= long <= side_max:
            return (long, short) if rng.random() < 0.5 else (short, long)


def random_sizes(seed: int, kinds: tuple[str, ...] | None = None,
                 scale: float = 1.0) -> list[SizeCase]:
    """The plan's sizes; `scale` shrinks every count (at least one per kind)."""
    rng = random.Random(seed)
    out: list[SizeCase] = []
    for kind, (count, (lo, hi)) in PLAN.items():
        if kinds is not None and kind not in kinds:
            continue
        for _ in range(max(1, round(count * scale))):
            if kind == "skinny":
                w, h = _skinny(rng, 50, 200, hi)
            elif kind == "extreme":
                w, h = _skinny(rng, 201, 2000, hi)
            else:
                w, h = rng.randint(lo, hi), rng.randint(lo, hi)
            out.append(SizeCase(kind, w, h))
    return out


def colour(seed: int) -> tuple[int, int, int]:
    return ((37 * seed + 90) % 256, (91 * seed + 30) % 256, (53 * seed + 160) % 256)


def solid_png(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), colour(seed)).save(buf, format="PNG")
    return buf.getvalue()


def image_part(width: int, height: int, seed: int) -> dict[str, Any]:
    url = to_data_url(solid_png(width, height, seed), "PNG")
    return {"type": "image_url", "image_url": {"url": url}}


# Message shapes: text strings, and [w, h, seed] for an image.
MESSAGES: dict[str, list[Any]] = {
    "image_text": [[64, 64, 1], "Describe this image in detail please."],
    "text_image": ["Describe", [64, 64, 1]],
    "text_image_text": ["Compare", [64, 64, 1], "Which is taller?"],
    "two_images_interleaved": ["Compare", [64, 64, 1], "with", [224, 224, 2],
                               "Which is taller?"],
    "two_images_first": [[64, 64, 1], [224, 224, 2], "Which is taller?"],
    "text_parts_only": ["Hello", "world"],
    "string_content": "Plain string content",
}


def message_content(shape: list[Any] | str) -> list[dict[str, Any]] | str:
    if isinstance(shape, str):
        return shape
    return [image_part(*p) if isinstance(p, list) else {"type": "text", "text": p}
            for p in shape]


def message_images(shape: list[Any] | str) -> list[bytes]:
    return [] if isinstance(shape, str) else [
        solid_png(*p) for p in shape if isinstance(p, list)]


# Processor-config variants per family: the pixel budget given where HF reads it (`size`),
# where SMG reads it (top level), both (disagreeing), and as a wrongly typed value.
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "qwen3-vl": {
        "size_only_narrow": {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2,
                             "size": {"shortest_edge": 200704, "longest_edge": 1003520}},
        "top_level_narrow": {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2,
                             "min_pixels": 200704, "max_pixels": 1003520},
        "both_disagree": {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2,
                          "min_pixels": 200704, "max_pixels": 1003520,
                          "size": {"shortest_edge": 65536, "longest_edge": 16777216}},
    },
    "glm-5.3-flash": {
        "size_only": {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2,
                      "size": {"shortest_edge": 50176, "longest_edge": 2007040}},
        "top_level_narrow": {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2,
                             "min_pixels": 50176, "max_pixels": 2007040},
        "image_tokens": {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2,
                         "min_image_tokens": 64, "max_image_tokens": 1280},
        "wrong_type": {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2,
                       "min_pixels": "50176", "max_pixels": 2007040},
    },
    "kimi-k3": {
        "in_patch_limit_16384": {"media_proc_cfg": {
            "in_patch_limit": 16384, "patch_size": 14, "merge_kernel_size": [2, 2],
            "patch_limit_on_one_side": 512}},
    },
}
