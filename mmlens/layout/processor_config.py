"""Reading image-processor parameters out of a checkpoint's config files.

A family's formula takes a frozen parameter record; these builders make one from the merged
`config.json` + `preprocessor_config.json` (+ `processor_config.json`) values, falling back
to the family's defaults where a key is absent and refusing values of the wrong type.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mmlens.errors import ProcessorConfigError
from mmlens.layout.image_tokens import (
    MAX_SIDE,
    Glm5Params,
    GlmParams,
    KimiParams,
    Llama4Params,
    LlavaParams,
    NemotronParams,
    QwenParams,
)

Config = Mapping[str, Any]

# Upper bounds keep every formula's cost independent of the values: real checkpoints use
# patch sizes of 14–16, a few thousand patches and pixel budgets below 2^30.
MAX_VALUE = 1 << 31
MAX_PATCH = 1024
MAX_TILES = 1024  # Llama 4 max_patches (16 in the checkpoints): canvases grow ~n·log n
MAX_PINPOINTS = 256


def positive_int(value: Any, key: str, limit: int = MAX_VALUE) -> int:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or (isinstance(value, float) and not math.isfinite(value)) or value != int(value)):
        raise ProcessorConfigError(f"processor config {key!r} must be an integer, got {value!r}")
    if value <= 0:
        raise ProcessorConfigError(f"processor config {key!r} must be positive, got {value!r}")
    if value > limit:
        raise ProcessorConfigError(
            f"processor config {key!r} = {str(value)[:20]} is beyond the limit of {limit}")
    return int(value)


def lookup(cfg: Config, *paths: str) -> Any:
    """First present value among dotted paths ("size.shortest_edge"), else None."""
    for path in paths:
        node: Any = cfg
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                node = None
                break
            node = node[part]
        if node is not None:
            return node
    return None


def get_int(cfg: Config, default: int | None, *paths: str, limit: int = MAX_VALUE) -> int:
    value = lookup(cfg, *paths)
    if value is None:
        if default is None:
            raise ProcessorConfigError(f"processor config lacks {paths[0]!r} and has no default")
        return default
    return positive_int(value, paths[0], limit)


def get_patch(cfg: Config, default: int | None, *paths: str) -> int:
    return get_int(cfg, default, *paths, limit=MAX_PATCH)


def qwen_params(cfg: Config, defaults: QwenParams) -> QwenParams:
    p = QwenParams(
        patch_size=get_patch(cfg, defaults.patch_size, "patch_size", "vision_config.patch_size"),
        merge_size=get_patch(
            cfg, defaults.merge_size, "merge_size", "vision_config.spatial_merge_size"
        ),
        min_pixels=get_int(cfg, defaults.min_pixels, "min_pixels", "size.shortest_edge"),
        max_pixels=get_int(cfg, defaults.max_pixels, "max_pixels", "size.longest_edge"),
    )
    if p.min_pixels > p.max_pixels:
        raise ProcessorConfigError(
            f"min_pixels {p.min_pixels} is larger than max_pixels {p.max_pixels}"
        )
    return p


def glm_params(cfg: Config, defaults: GlmParams) -> GlmParams:
    return GlmParams(
        patch_size=get_patch(cfg, defaults.patch_size, "patch_size", "vision_config.patch_size"),
        merge_size=get_patch(
            cfg, defaults.merge_size, "merge_size", "vision_config.spatial_merge_size"
        ),
        temporal_patch_size=get_patch(cfg, defaults.temporal_patch_size, "temporal_patch_size"),
        min_pixels=get_int(cfg, defaults.min_pixels, "size.shortest_edge", "min_pixels"),
        max_pixels=get_int(cfg, defaults.max_pixels, "size.longest_edge", "max_pixels"),
    )


def _glm5_grid(cfg: Config, defaults: Glm5Params) -> dict[str, int]:
    return {
        "patch_size": get_patch(cfg, defaults.patch_size, "patch_size"),
        "merge_size": get_patch(cfg, defaults.merge_size, "merge_size"),
        "temporal_patch_size": get_patch(cfg, defaults.temporal_patch_size,
                                         "temporal_patch_size"),
    }


def _glm5_budget(cfg: Config, grid: dict[str, int], keys: tuple[str, ...], default: int,
                 ) -> int:
    """A pixel budget from the first present key: `*_pixels` as is, `*_image_tokens` times
    the pixels one token covers."""
    per_token = grid["temporal_patch_size"] * (grid["patch_size"] * grid["merge_size"]) ** 2
    for key in keys:
        value = lookup(cfg, key)
        if value is not None:
            n = positive_int(value, key)
            return n * per_token if key.endswith("_image_tokens") else n
    return default // Glm5Params().pixels_per_token * per_token


def glm53_params(cfg: Config, defaults: Glm5Params) -> Glm5Params:
    """SMG 1.13 (observed): top-level `min_pixels`/`max_pixels` first, then HF's
    `min_image_tokens`/`max_image_tokens`, else 16/8000 tokens; `size` is not read; images
    over 200:1 are refused."""
    grid = _glm5_grid(cfg, defaults)
    p = Glm5Params(
        **grid,
        min_pixels=_glm5_budget(cfg, grid, ("min_pixels", "min_image_tokens"),
                                defaults.min_pixels),
        max_pixels=_glm5_budget(cfg, grid, ("max_pixels", "max_image_tokens"),
                                defaults.max_pixels),
        max_aspect=200,
    )
    return _ordered(p)


def glm5_hf_params(cfg: Config, defaults: Glm5Params) -> Glm5Params:
    """transformers' glm5_next processor: only `min_image_tokens`/`max_image_tokens`; neither
    top-level pixel keys nor `size` are read; no aspect limit."""
    grid = _glm5_grid(cfg, defaults)
    p = Glm5Params(
        **grid,
        min_pixels=_glm5_budget(cfg, grid, ("min_image_tokens",), defaults.min_pixels),
        max_pixels=_glm5_budget(cfg, grid, ("max_image_tokens",), defaults.max_pixels),
    )
    return _ordered(p)


def _ordered(p: Glm5Params) -> Glm5Params:
    if p.min_pixels > p.max_pixels:
        raise ProcessorConfigError(
            f"min pixel budget {p.min_pixels} is larger than the max {p.max_pixels}")
    return p


def kimi_params(cfg: Config, defaults: KimiParams) -> KimiParams:
    media = lookup(cfg, "media_proc_cfg")
    src: Config = media if isinstance(media, Mapping) else cfg
    merge = lookup(src, "merge_kernel_size")
    if isinstance(merge, list | tuple):
        if len(merge) != 2 or merge[0] != merge[1]:
            raise ProcessorConfigError(f"merge_kernel_size must be square, got {merge!r}")
        merge = merge[0]
    return KimiParams(
        patch_size=get_patch(src, defaults.patch_size, "patch_size"),
        merge_kernel_size=(
            defaults.merge_kernel_size if merge is None
            else positive_int(merge, "merge_kernel_size", MAX_PATCH)
        ),
        in_patch_limit=get_int(src, defaults.in_patch_limit, "in_patch_limit"),
        patch_limit_on_one_side=get_int(
            src, defaults.patch_limit_on_one_side, "patch_limit_on_one_side"
        ),
    )


def llava_params(cfg: Config, defaults: LlavaParams) -> LlavaParams:
    strategy = lookup(cfg, "vision_feature_select_strategy")
    if strategy is not None and strategy not in ("default", "full"):
        raise ProcessorConfigError(f"unknown vision_feature_select_strategy {strategy!r}")
    image_size = get_int(cfg, defaults.image_size, "crop_size.height", "size.shortest_edge",
                         "vision_config.image_size", limit=MAX_SIDE)
    patch_size = get_patch(cfg, defaults.patch_size, "vision_config.patch_size", "patch_size")
    if patch_size > image_size:
        raise ProcessorConfigError(f"patch_size {patch_size} is larger than the image size "
                                   f"{image_size}")
    extra = lookup(cfg, "num_additional_image_tokens")
    if extra is not None and (type(extra) is not int or not 0 <= extra <= 16):
        raise ProcessorConfigError(
            f"processor config 'num_additional_image_tokens' must be 0..16, got {extra!r}")
    return LlavaParams(
        image_size=image_size, patch_size=patch_size,
        num_additional_image_tokens=extra or defaults.num_additional_image_tokens,
        default_strategy=(strategy or "default") == "default",
        grid_pinpoints=_pinpoints(lookup(cfg, "image_grid_pinpoints"), defaults.grid_pinpoints),
    )


def _pinpoints(value: Any, default: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """anyres canvases: at most MAX_PINPOINTS (the formula tries each)."""
    if value is None:
        return default
    if not isinstance(value, list | tuple) or len(value) > MAX_PINPOINTS:
        raise ProcessorConfigError(
            f"image_grid_pinpoints must be a list of at most {MAX_PINPOINTS} [h, w] pairs")
    try:
        grid = tuple((positive_int(h, "h", MAX_SIDE), positive_int(w, "w", MAX_SIDE))
                     for h, w in value)
    except (TypeError, ValueError) as exc:
        raise ProcessorConfigError(f"malformed image_grid_pinpoints: {exc}") from exc
    if not grid:
        raise ProcessorConfigError("image_grid_pinpoints is empty")
    return grid


def llama4_params(cfg: Config, defaults: Llama4Params) -> Llama4Params:
    ratio = lookup(cfg, "vision_config.pixel_shuffle_ratio")
    if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, int | float)
                              or not 0 < ratio <= 1):
        raise ProcessorConfigError(f"pixel_shuffle_ratio must be in (0, 1], got {ratio!r}")
    p = Llama4Params(
        tile_size=get_int(cfg, defaults.tile_size, "size.height", "vision_config.image_size",
                          limit=MAX_SIDE),
        patch_size=get_patch(cfg, defaults.patch_size, "vision_config.patch_size"),
        pixel_shuffle_ratio=float(ratio) if ratio is not None else defaults.pixel_shuffle_ratio,
        max_patches=get_int(cfg, defaults.max_patches, "max_patches", limit=MAX_TILES),
    )
    if p.tokens_per_tile < 1:
        raise ProcessorConfigError(f"tile {p.tile_size} with patch {p.patch_size} and pixel "
                                   f"shuffle {p.pixel_shuffle_ratio} leaves no token per tile")
    return p


def nemotron_params(cfg: Config, defaults: NemotronParams) -> NemotronParams:
    return NemotronParams(
        patch_size=get_patch(cfg, defaults.patch_size, "patch_size", "vision_config.patch_size"),
        min_num_patches=get_int(
            cfg, defaults.min_num_patches, "vision_config.args.min_num_patches",
            "min_num_patches",
        ),
        max_num_patches=get_int(
            cfg, defaults.max_num_patches, "vision_config.args.max_num_patches",
            "max_num_patches",
        ),
        max_model_len=get_int(cfg, defaults.max_model_len, "max_model_len"),
    )
