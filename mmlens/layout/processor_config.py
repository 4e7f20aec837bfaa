"""Reading image-processor parameters out of a checkpoint's config files.

A family's formula takes a frozen parameter record; these builders make one from the merged
`config.json` + `preprocessor_config.json` (+ `processor_config.json`) values, falling back
to the family's defaults where a key is absent and refusing values of the wrong type.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmlens.errors import ProcessorConfigError
from mmlens.layout.image_tokens import (
    GlmParams,
    KimiParams,
    Llama4Params,
    LlavaParams,
    NemotronParams,
    QwenParams,
)

Config = Mapping[str, Any]


def positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ProcessorConfigError(f"processor config {key!r} must be an integer, got {value!r}")
    if value <= 0:
        raise ProcessorConfigError(f"processor config {key!r} must be positive, got {value!r}")
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


def get_int(cfg: Config, default: int | None, *paths: str) -> int:
    value = lookup(cfg, *paths)
    if value is None:
        if default is None:
            raise ProcessorConfigError(f"processor config lacks {paths[0]!r} and has no default")
        return default
    return positive_int(value, paths[0])


def qwen_params(cfg: Config, defaults: QwenParams) -> QwenParams:
    p = QwenParams(
        patch_size=get_int(cfg, defaults.patch_size, "patch_size", "vision_config.patch_size"),
        merge_size=get_int(
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
        patch_size=get_int(cfg, defaults.patch_size, "patch_size", "vision_config.patch_size"),
        merge_size=get_int(
            cfg, defaults.merge_size, "merge_size", "vision_config.spatial_merge_size"
        ),
        temporal_patch_size=get_int(cfg, defaults.temporal_patch_size, "temporal_patch_size"),
        min_pixels=get_int(cfg, defaults.min_pixels, "size.shortest_edge", "min_pixels"),
        max_pixels=get_int(cfg, defaults.max_pixels, "size.longest_edge", "max_pixels"),
    )


def glm53_params(cfg: Config, defaults: GlmParams) -> GlmParams:
    """SMG 1.13 reads top-level min_pixels, max_pixels and patch_size; a `size` object has
    no effect there, so it is not read here either. All three must be present."""
    return GlmParams(
        patch_size=get_int(cfg, None, "patch_size"),
        merge_size=get_int(cfg, defaults.merge_size, "merge_size"),
        temporal_patch_size=get_int(cfg, defaults.temporal_patch_size, "temporal_patch_size"),
        min_pixels=get_int(cfg, None, "min_pixels"),
        max_pixels=get_int(cfg, None, "max_pixels"),
        round_up=True,
    )


def kimi_params(cfg: Config, defaults: KimiParams) -> KimiParams:
    media = lookup(cfg, "media_proc_cfg")
    src: Config = media if isinstance(media, Mapping) else cfg
    merge = lookup(src, "merge_kernel_size")
    if isinstance(merge, list | tuple):
        if len(merge) != 2 or merge[0] != merge[1]:
            raise ProcessorConfigError(f"merge_kernel_size must be square, got {merge!r}")
        merge = merge[0]
    return KimiParams(
        patch_size=get_int(src, defaults.patch_size, "patch_size"),
        merge_kernel_size=(
            defaults.merge_kernel_size if merge is None
            else positive_int(merge, "merge_kernel_size")
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
    pinpoints = lookup(cfg, "image_grid_pinpoints")
    if pinpoints is None:
        grid = defaults.grid_pinpoints
    else:
        try:
            grid = tuple((positive_int(h, "h"), positive_int(w, "w")) for h, w in pinpoints)
        except (TypeError, ValueError) as exc:
            raise ProcessorConfigError(f"malformed image_grid_pinpoints: {exc}") from exc
        if not grid:
            raise ProcessorConfigError("image_grid_pinpoints is empty")
    return LlavaParams(
        image_size=get_int(
            cfg, defaults.image_size, "crop_size.height", "size.shortest_edge",
            "vision_config.image_size",
        ),
        patch_size=get_int(cfg, defaults.patch_size, "vision_config.patch_size", "patch_size"),
        num_additional_image_tokens=int(
            lookup(cfg, "num_additional_image_tokens") or defaults.num_additional_image_tokens
        ),
        default_strategy=(strategy or "default") == "default",
        grid_pinpoints=grid,
    )


def llama4_params(cfg: Config, defaults: Llama4Params) -> Llama4Params:
    ratio = lookup(cfg, "vision_config.pixel_shuffle_ratio")
    return Llama4Params(
        tile_size=get_int(cfg, defaults.tile_size, "size.height", "vision_config.image_size"),
        patch_size=get_int(cfg, defaults.patch_size, "vision_config.patch_size"),
        pixel_shuffle_ratio=float(ratio) if ratio is not None else defaults.pixel_shuffle_ratio,
        max_patches=get_int(cfg, defaults.max_patches, "max_patches"),
    )


def nemotron_params(cfg: Config, defaults: NemotronParams) -> NemotronParams:
    return NemotronParams(
        patch_size=get_int(cfg, defaults.patch_size, "patch_size", "vision_config.patch_size"),
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
