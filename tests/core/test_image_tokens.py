"""Every worked example of the reference's model-families chapter, as a test."""

import pytest

from mmlens.errors import ImageError, LayoutError, ProcessorConfigError
from mmlens.layout.families import get_family
from mmlens.layout.image_tokens import (
    GlmParams,
    KimiParams,
    NemotronParams,
    QwenParams,
    kimi_resize,
    llama4_tile_grid,
    llava_best_resolution,
    nemotron_request_tokens,
    qwen_smart_resize,
)

HF_QWEN2 = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2}
SMG_QWEN2_COMPILED = {"min_pixels": 200704, "max_pixels": 1003520}
QWEN3 = {"patch_size": 16, "merge_size": 2,
         "size": {"shortest_edge": 65536, "longest_edge": 16777216}}


def case(family, size, expected, config=None):
    w, h = size
    return pytest.param(family, w, h, expected, config, id=f"{family}-{w}x{h}")


EXAMPLES = [
    # Qwen2-VL with HF checkpoint settings, and SMG's compiled defaults.
    case("qwen2-vl", (640, 480), 391, HF_QWEN2),
    case("qwen2-vl", (1280, 720), 1196, HF_QWEN2),
    case("qwen2-vl", (56, 56), 4, HF_QWEN2),
    case("qwen2-vl", (300, 1000), 396, HF_QWEN2),
    case("qwen2-vl", (4000, 3000), 15301, HF_QWEN2),
    case("qwen2-vl", (224, 224), 64, HF_QWEN2),
    case("qwen2-vl", (1024, 768), 999, HF_QWEN2),
    case("qwen2-vl", (1920, 1080), 2691, HF_QWEN2),
    case("qwen2-vl", (224, 224), 256, SMG_QWEN2_COMPILED),
    case("qwen2-vl", (640, 480), 391, SMG_QWEN2_COMPILED),
    case("qwen2-vl", (1024, 768), 999, SMG_QWEN2_COMPILED),
    case("qwen2-vl", (1920, 1080), 1222, SMG_QWEN2_COMPILED),
    case("qwen2-vl", (4000, 3000), 1230, SMG_QWEN2_COMPILED),
    case("qwen2.5-vl", (640, 480), 391, HF_QWEN2),
    # Qwen3-VL: factor 32, min 65536 pixels; 720/32 = 22.5 rounds half-even to 22.
    *[case("qwen3-vl", s, n, QWEN3) for s, n in [
        ((224, 224), 64), ((640, 480), 300), ((1024, 768), 768), ((1024, 1024), 1024),
        ((1280, 720), 880), ((1920, 1080), 2040), ((4000, 3000), 11750), ((4096, 4096), 16384),
        ((336, 336), 100), ((100, 100), 64), ((64, 64), 64), ((256, 256), 64)]],
    case("qwen3-vl", (1280, 720), 880, None),
    # LLaVA-1.5: 576 for any image.
    case("llava-1.5", (640, 480), 576), case("llava-1.5", (1280, 720), 576),
    case("llava-1.5", (17, 4000), 576),
    # LLaVA-NeXT anyres.
    *[case("llava-next", s, n) for s, n in [
        ((224, 224), 1176), ((336, 336), 1176), ((640, 480), 2340), ((1024, 768), 2340),
        ((1280, 720), 1948), ((1920, 1080), 1948), ((4000, 3000), 2340)]],
    # Llama 4: 3 + 144 (+ tiles·145 when tiles > 1).
    *[case("llama-4", s, n) for s, n in [
        ((224, 224), 147), ((640, 480), 727), ((1024, 768), 1887), ((1280, 720), 1887),
        ((1920, 1080), 2322), ((4000, 3000), 1887)]],
    # Kimi-K2.5 with SMG/Dynamo limits (16384, 512).
    *[case("kimi-k2.5", s, n) for s, n in [
        ((224, 224), 64), ((640, 480), 414), ((1024, 768), 1036), ((1280, 720), 1196),
        ((1920, 1080), 2691), ((4000, 3000), 4200)]],
    # Kimi-K2.5 with vLLM's fallback config (4096, one side 64): router and engine diverge.
    *[case("kimi-k2.5", s, n, {"media_proc_cfg": {"in_patch_limit": 4096,
                                                   "patch_limit_on_one_side": 64}})
      for s, n in [((224, 224), 64), ((640, 480), 414), ((1024, 768), 768),
                   ((1280, 720), 576), ((1920, 1080), 576), ((4000, 3000), 768)]],
    # Kimi-K3 (in_patch_limit 65536), including SMG 1.13.0's observed 64×64 → 9, 1000×700 → 900.
    *[case("kimi-k3", s, n) for s, n in [
        ((64, 64), 9), ((224, 224), 64), ((640, 480), 414), ((1000, 700), 900),
        ((1024, 768), 1036), ((1920, 1080), 2691), ((4000, 3000), 15444)]],
    # GLM-4.xV (HF 5.24 defaults).
    *[case("glm-4v", s, n) for s, n in [
        ((64, 64), 9), ((100, 100), 16), ((224, 224), 64), ((640, 480), 391),
        ((1024, 768), 999), ((1280, 720), 1196), ((1920, 1080), 2691), ((4000, 3000), 7500)]],
    # Nemotron Nano Omni goldens (patch 16, min 1024, max 13312), one image.
    *[case("nemotron-omni", s, n) for s, n in [
        ((224, 224), 256), ((64, 32), 276), ((512, 512), 256), ((1000, 500), 512),
        ((1024, 1024), 1024), ((1536, 1536), 2304), ((1920, 1080), 2040), ((640, 480), 300),
        ((1280, 720), 920), ((1024, 768), 768)]],
]


@pytest.mark.parametrize(("family", "width", "height", "expected", "config"), EXAMPLES)
def test_worked_examples(family, width, height, expected, config):
    assert get_family(family).image_token_count(width, height, config) == expected


def test_qwen_resize_targets_of_the_worked_examples():
    # 640×480 at factor 28: h̄ = 17·28, w̄ = 23·28; 1280×720 at factor 32: 22·32 × 40·32.
    assert qwen_smart_resize(480, 640, 28, 3136, 12845056) == (476, 644)
    assert qwen_smart_resize(720, 1280, 32, 65536, 16777216) == (704, 1280)
    assert qwen_smart_resize(224, 224, 32, 65536, 16777216) == (256, 256)


def test_kimi_4000x3000_resize_of_the_worked_example():
    assert kimi_resize(4000, 3000, KimiParams()) == (2073, 1554)
    assert kimi_resize(4000, 3000, KimiParams(in_patch_limit=65536)) == (4000, 3000)


def test_llama4_tile_grids():
    assert llama4_tile_grid(640, 480, get_family("llama-4").params()) == (2, 2)
    assert llama4_tile_grid(1280, 720, get_family("llama-4").params()) == (3, 4)
    assert llama4_tile_grid(1920, 1080, get_family("llama-4").params()) == (3, 5)


def test_llava_next_best_canvas():
    pins = get_family("llava-next").params().grid_pinpoints
    assert llava_best_resolution(480, 640, pins) == (672, 672)
    assert llava_best_resolution(336, 336, pins) == (336, 672)


def test_nemotron_budget_is_request_wide():
    p = NemotronParams(max_model_len=4096)
    assert nemotron_request_tokens([(1920, 1080)] * 3, 10, p) == [1344, 1344, 1344]
    # One image alone under the same limit keeps its full count.
    assert nemotron_request_tokens([(1920, 1080)], 10, p) == [2040]


@pytest.mark.parametrize("size", [(0, 10), (10, 0), (-5, 10), (70000, 10), (10, 10**6)])
def test_impossible_sizes_are_refused(size):
    with pytest.raises(ImageError):
        get_family("qwen3-vl").image_token_count(*size)


def test_aspect_ratio_past_the_limit_is_refused():
    with pytest.raises(LayoutError, match="aspect ratio"):
        get_family("qwen3-vl").image_token_count(20_100, 100)
    # LLaVA has no such limit: every image is 576.
    assert get_family("llava-1.5").image_token_count(20_100, 100) == 576


@pytest.mark.parametrize("bad", [
    {"patch_size": "16"}, {"patch_size": 0}, {"min_pixels": -1}, {"merge_size": 1.5},
    {"min_pixels": 10**9, "max_pixels": 10},
])
def test_malformed_processor_values_are_refused(bad):
    with pytest.raises(ProcessorConfigError):
        get_family("qwen3-vl").image_token_count(640, 480, bad)


def test_params_record_types():
    assert get_family("qwen3-vl").params(QWEN3) == QwenParams(16, 2, 65536, 16777216)
    assert get_family("glm-4v").params({}) == GlmParams(14, 2, 2, 12544, 11760000)
