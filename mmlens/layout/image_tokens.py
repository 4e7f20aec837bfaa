"""Image-token counts: how many prompt tokens one image of W×H pixels becomes, per family.

Every function here is pure arithmetic on the image size and a frozen parameter record built
from the checkpoint's processor config. Rounding follows the processors exactly: Python's
`round` is round-half-even, as in the Hugging Face processors, and that matters (Qwen3-VL
1280×720: 720/32 = 22.5 rounds to 22).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mmlens.errors import ImageError, LayoutError, ProcessorConfigError

MAX_SIDE = 65_535
MAX_PIXELS = 1 << 30


def check_size(width: int, height: int) -> None:
    """Refuse sizes no processor can handle, before any formula runs."""
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ImageError(f"image {name} must be an integer, got {value!r}")
        if value <= 0:
            raise ImageError(f"image {name} must be positive, got {value}")
        if value > MAX_SIDE:
            raise ImageError(f"image {name} {value} px exceeds the {MAX_SIDE} px limit")
    if width * height > MAX_PIXELS:
        raise ImageError(f"image {width}x{height} exceeds {MAX_PIXELS} pixels")


def check_aspect(width: int, height: int, limit: float, family: str) -> None:
    ratio = max(width, height) / min(width, height)
    if ratio > limit:
        raise LayoutError(
            f"{family}: aspect ratio {ratio:.1f} of {width}x{height} exceeds the family's "
            f"limit of {limit:g}"
        )


# --- Qwen2-VL / Qwen2.5-VL / Qwen3-VL --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QwenParams:
    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


def qwen_smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int,
    *, at_least_one_cell: bool = False,
) -> tuple[int, int]:
    """Resize target (h̄, w̄): multiples of `factor`, area within [min_pixels, max_pixels].

    640×480 at factor 28 → (476, 644); 224×224 at factor 32, min 65536 → (256, 256).
    A side under factor/2 rounds to 0 and the min-pixels rescale takes over; with
    `at_least_one_cell` (Dynamo 1.6.1's estimator) it rounds to one cell instead.
    """
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if at_least_one_cell:
        h_bar, w_bar = max(factor, h_bar), max(factor, w_bar)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen_tokens(width: int, height: int, p: QwenParams, family: str = "qwen") -> int:
    check_size(width, height)
    check_aspect(width, height, 200, family)
    h_bar, w_bar = qwen_smart_resize(height, width, p.factor, p.min_pixels, p.max_pixels)
    return (h_bar // p.factor) * (w_bar // p.factor)


# --- GLM-4.1V / 4.5V / 4.6V ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GlmParams:
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int


def glm_smart_resize(
    height: int, width: int, p: GlmParams, num_frames: int | None = None
) -> tuple[int, int]:
    """GLM-4V's resize: the pixel budget covers t̄·h̄·w̄ (t̄ = 2 for one image)."""
    factor = p.patch_size * p.merge_size
    t = p.temporal_patch_size
    frames = t if num_frames is None else num_frames
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(frames / t) * t
    if t_bar * h_bar * w_bar > p.max_pixels:
        beta = math.sqrt(frames * height * width / p.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < p.min_pixels:
        beta = math.sqrt(p.min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def glm_tokens(width: int, height: int, p: GlmParams) -> int:
    check_size(width, height)
    check_aspect(width, height, 200, "glm-4v")
    h_bar, w_bar = glm_smart_resize(height, width, p)
    return (h_bar // p.patch_size) * (w_bar // p.patch_size) // (p.merge_size**2)


# --- GLM-5.3-Flash (HF `glm5_next`) --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Glm5Params:
    """Budgets are pixels of t̄·h̄·w̄ (t̄ = 2 for an image); HF states them in image tokens
    (16 and 8000 by default, one token = t̄·factor² pixels)."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 16 * 2 * 28 * 28
    max_pixels: int = 8000 * 2 * 28 * 28
    max_aspect: float | None = None  # SMG refuses images over 200:1; HF has no limit

    @property
    def pixels_per_token(self) -> int:
        return self.temporal_patch_size * (self.patch_size * self.merge_size) ** 2


def glm5_smart_resize(height: int, width: int, p: Glm5Params) -> tuple[int, int]:
    """Sides rounded *up* to the grid (no upscaling of a short side first); under the minimum
    both sides scale up; over the maximum the tallest content height whose rounded-up canvas
    fits is searched (SMG 1.13 and transformers' glm5_next agree on this)."""
    factor = p.patch_size * p.merge_size
    frames = p.temporal_patch_size  # one image fills the temporal patch

    def up(value: float) -> int:
        return math.ceil(value / factor) * factor

    h_bar, w_bar = up(height), up(width)
    if frames * h_bar * w_bar < p.min_pixels:
        scale = math.sqrt(p.min_pixels / (frames * height * width))
        h_bar = up(max(1, math.ceil(height * scale)))
        w_bar = up(max(1, math.ceil(width * scale)))
    if frames * h_bar * w_bar > p.max_pixels:
        if p.max_pixels < frames * factor * factor:
            raise LayoutError(f"max_pixels {p.max_pixels} is below one {factor}-px patch")
        low, high = 1, height
        h_bar = w_bar = factor
        while low <= high:
            mid = (low + high) // 2
            cand_h, cand_w = up(mid), up(max(1, width * mid // height))
            if frames * cand_h * cand_w <= p.max_pixels:
                h_bar, w_bar, low = cand_h, cand_w, mid + 1
            else:
                high = mid - 1
    return h_bar, w_bar


def glm5_tokens(width: int, height: int, p: Glm5Params) -> int:
    check_size(width, height)
    if p.max_aspect is not None:
        check_aspect(width, height, p.max_aspect, "glm-5.3-flash")
    h_bar, w_bar = glm5_smart_resize(height, width, p)
    return (h_bar // p.patch_size) * (w_bar // p.patch_size) // (p.merge_size**2)


# --- LLaVA-1.5 / LLaVA-NeXT -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LlavaParams:
    image_size: int = 336
    patch_size: int = 14
    num_additional_image_tokens: int = 1
    default_strategy: bool = True  # vision_feature_select_strategy == "default" drops CLS
    grid_pinpoints: tuple[tuple[int, int], ...] = (
        (336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008),
    )

    @property
    def base_tokens(self) -> int:
        side = self.image_size // self.patch_size
        return side * side + self.num_additional_image_tokens - int(self.default_strategy)


def llava_tokens(width: int, height: int, p: LlavaParams) -> int:
    check_size(width, height)
    return p.base_tokens


def llava_best_resolution(
    height: int, width: int, pinpoints: tuple[tuple[int, int], ...]
) -> tuple[int, int]:
    """The (h, w) canvas with the largest effective resolution, then the least waste."""
    best = pinpoints[0]
    best_effective, least_waste = -1, math.inf
    for cand_h, cand_w in pinpoints:
        scale = min(cand_w / width, cand_h / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        waste = cand_h * cand_w - effective
        if effective > best_effective or (effective == best_effective and waste < least_waste):
            best, best_effective, least_waste = (cand_h, cand_w), effective, waste
    return best


def llava_next_tokens(width: int, height: int, p: LlavaParams) -> int:
    """anyres: unpadded grid of the best canvas + one newline per row + the base image."""
    check_size(width, height)
    best_h, best_w = llava_best_resolution(height, width, p.grid_pinpoints)
    side = p.image_size // p.patch_size
    cur_h = side * (best_h // p.image_size)
    cur_w = side * (best_w // p.image_size)
    if not cur_h or not cur_w:
        raise ProcessorConfigError(f"anyres canvas {best_h}x{best_w} is smaller than one "
                                   f"{p.image_size}px tile")
    if width / height > cur_w / cur_h:
        new_h = int(round(height * (cur_w / width), 7))
        cur_h -= 2 * ((cur_h - new_h) // 2)
    else:
        new_w = int(round(width * (cur_h / height), 7))
        cur_w -= 2 * ((cur_w - new_w) // 2)
    return cur_h * cur_w + cur_h + p.base_tokens


# --- Llama 4 ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Llama4Params:
    tile_size: int = 336
    patch_size: int = 14
    pixel_shuffle_ratio: float = 0.5
    max_patches: int = 16

    @property
    def tokens_per_tile(self) -> int:
        side = self.tile_size // self.patch_size
        return int(side * side * self.pixel_shuffle_ratio**2)


def llama4_canvases(max_patches: int, tile: int) -> list[tuple[int, int]]:
    return [
        (rows * tile, cols * tile)
        for rows in range(1, max_patches + 1)
        for cols in range(1, max_patches // rows + 1)
    ]


def llama4_tile_grid(width: int, height: int, p: Llama4Params) -> tuple[int, int]:
    """(rows, cols) of the canvas: the smallest upscale ≥ 1, else the largest downscale;
    ties go to the smaller canvas."""
    check_size(width, height)
    options = []
    for cand_h, cand_w in llama4_canvases(p.max_patches, p.tile_size):
        options.append((min(cand_h / height, cand_w / width), cand_h * cand_w, cand_h, cand_w))
    ups = [o for o in options if o[0] >= 1]
    if ups:
        scale = min(o[0] for o in ups)
    else:
        scale = max(o[0] for o in options)
    _, _, cand_h, cand_w = min(o for o in options if o[0] == scale)
    return cand_h // p.tile_size, cand_w // p.tile_size


def llama4_tokens(width: int, height: int, p: Llama4Params) -> int:
    rows, cols = llama4_tile_grid(width, height, p)
    tiles = rows * cols
    n = 3 + p.tokens_per_tile
    if tiles > 1:
        n += tiles * p.tokens_per_tile + tiles
    return n


# --- Kimi (MoonViT) -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KimiParams:
    patch_size: int = 14
    merge_kernel_size: int = 2
    in_patch_limit: int = 16384
    patch_limit_on_one_side: int = 512


def kimi_resize(width: int, height: int, p: KimiParams) -> tuple[int, int]:
    """navit_resize: never upscales; caps the patch count and each side."""
    side_px = p.patch_limit_on_one_side * p.patch_size
    patches = max(1, width // p.patch_size) * max(1, height // p.patch_size)
    scale = min(1.0, math.sqrt(p.in_patch_limit / patches), side_px / width, side_px / height)
    new_w = min(max(1, int(width * scale)), side_px)
    new_h = min(max(1, int(height * scale)), side_px)
    return new_w, new_h


def kimi_tokens(width: int, height: int, p: KimiParams) -> int:
    check_size(width, height)
    new_w, new_h = kimi_resize(width, height, p)
    unit = p.patch_size * p.merge_kernel_size
    return math.ceil(new_h / unit) * math.ceil(new_w / unit)


# --- Nemotron Nano Omni ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NemotronParams:
    patch_size: int = 16
    min_num_patches: int = 1024
    max_num_patches: int = 13312
    max_model_len: int = 131072


def nemotron_grid(width: int, height: int, budget: int, p: NemotronParams) -> tuple[int, int]:
    """Patch grid (th, tw) of one image within a patch budget."""
    ph = round(height / p.patch_size + 0.5)
    pw = round(width / p.patch_size + 0.5)
    f = min(1.0, math.sqrt(budget / (ph * pw)))
    th, tw = math.floor(f * ph), math.floor(f * pw)
    if budget > p.min_num_patches and th * tw < p.min_num_patches:
        up = math.sqrt(p.min_num_patches / (th * tw))
        th, tw = math.ceil(th * up), math.ceil(tw * up)
    if th % 2:
        th = th + 1 if (th + 1) * tw <= budget else th - 1
    if tw % 2:
        tw = tw + 1 if th * (tw + 1) <= budget else tw - 1
    return max(th, 2), max(tw, 2)


def nemotron_request_tokens(
    sizes: list[tuple[int, int]], text_len: int, p: NemotronParams
) -> list[int]:
    """Per-image counts under the request-wide patch budget (it shrinks with more images)."""
    for w, h in sizes:
        check_size(w, h)
    if not sizes:
        return []
    budget = max((p.max_model_len - text_len - 4) * 4, p.min_num_patches * len(sizes))
    start = min(max(budget, p.min_num_patches), p.max_num_patches)
    per_image = [start] * len(sizes)
    grids = [nemotron_grid(w, h, b, p) for (w, h), b in zip(sizes, per_image, strict=True)]
    for _ in range(10):
        total = sum(th * tw for th, tw in grids)
        if total <= budget:
            break
        per_image = [
            max(p.min_num_patches, math.floor(th * tw * budget / total)) for th, tw in grids
        ]
        grids = [nemotron_grid(w, h, b, p) for (w, h), b in zip(sizes, per_image, strict=True)]
    return [th * tw // 4 for th, tw in grids]
