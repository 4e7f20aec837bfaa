"""mmlens' image-token counts against transformers' own processors (no torch needed).

Llama 4's image processor needs torch, and Kimi's processors are remote code: those two
families are covered by the worked examples only.
"""

import random

import numpy as np
import pytest
from PIL import Image

from mmlens.layout.families import get_family

transformers = pytest.importorskip("transformers")


def sizes() -> list[tuple[int, int]]:
    fixed = [
        (1, 1), (2, 3), (17, 29), (28, 28), (29, 31), (55, 57), (64, 64), (100, 100),
        (224, 224), (336, 336), (333, 777), (640, 480), (1024, 768), (1280, 720),
        (1920, 1080), (4000, 3000), (4096, 4096), (8192, 8192), (16000, 9000),
        (3000, 20), (20, 3000), (5000, 40), (40, 5000), (7, 1200), (1200, 7), (999, 1),
        (1, 150), (12345, 678), (678, 12345), (513, 511),
    ]
    rng = random.Random(20261130)
    extra = [(rng.randint(1, 5000), rng.randint(1, 5000)) for _ in range(40)]
    out = []
    for w, h in fixed + extra:
        if max(w, h) / min(w, h) <= 200:
            out.append((w, h))
    return out


SIZES = sizes()


def test_enough_sizes():
    assert len(SIZES) >= 60


@pytest.mark.parametrize(("family", "config"), [
    ("qwen2-vl", {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14,
                  "merge_size": 2}),
    ("qwen2-vl", {"min_pixels": 200704, "max_pixels": 1003520, "patch_size": 14,
                  "merge_size": 2}),
    ("qwen3-vl", {"min_pixels": 65536, "max_pixels": 16777216, "patch_size": 16,
                  "merge_size": 2}),
])
def test_qwen_counts_equal_the_qwen2vl_image_processor(family, config):
    proc = transformers.Qwen2VLImageProcessorPil(**config)
    fam = get_family(family)
    mismatches = []
    for w, h in SIZES:
        expected = proc.get_number_of_image_patches(h, w, {}) // config["merge_size"] ** 2
        got = fam.image_token_count(w, h, config)
        if got != expected:
            mismatches.append((w, h, got, expected))
    assert not mismatches


def test_glm4v_counts_equal_the_glm4v_image_processor():
    proc = transformers.Glm4vImageProcessorPil()
    fam = get_family("glm-4v")
    mismatches = []
    for w, h in SIZES:
        expected = proc.get_number_of_image_patches(h, w, {}) // 4
        got = fam.image_token_count(w, h)
        if got != expected:
            mismatches.append((w, h, got, expected))
    assert not mismatches


@pytest.mark.parametrize("size", [(17, 29), (640, 480), (333, 777), (1280, 720), (3000, 20)])
def test_qwen_pixel_path_agrees_with_the_patch_count(size):
    # The full preprocessing path (real pixels) gives the same grid as the count helper.
    w, h = size
    proc = transformers.Qwen2VLImageProcessorPil(min_pixels=65536, max_pixels=16777216,
                                                 patch_size=16, merge_size=2)
    out = proc(images=[Image.new("RGB", (w, h), (200, 30, 30))], return_tensors="np")
    grid = np.asarray(out["image_grid_thw"])[0]
    assert int(np.prod(grid)) // 4 == get_family("qwen3-vl").image_token_count(w, h)


def llava_processor(cls_name: str, image_processor, tmp_path):
    from mmlens.layout.tokenizers import write_shape_faithful_tokenizer

    write_shape_faithful_tokenizer("llava-1.5", tmp_path)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    cls = getattr(transformers, cls_name)
    return cls(image_processor=image_processor, tokenizer=tok, patch_size=14,
               vision_feature_select_strategy="default", num_additional_image_tokens=1)


def test_llava_next_counts_equal_the_llava_next_processor(tmp_path):
    image_proc = transformers.LlavaNextImageProcessorPil(
        size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
    proc = llava_processor("LlavaNextProcessor", image_proc, tmp_path)
    fam = get_family("llava-next")
    mismatches = []
    for w, h in SIZES:
        expected = proc._get_num_multimodal_tokens(image_sizes=[(h, w)])["num_image_tokens"][0]
        got = fam.image_token_count(w, h)
        if got != expected:
            mismatches.append((w, h, got, expected))
    assert not mismatches


def test_llava_counts_equal_the_llava_processor(tmp_path):
    image_proc = transformers.LlavaImageProcessorPil(
        size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
    proc = llava_processor("LlavaProcessor", image_proc, tmp_path)
    fam = get_family("llava-1.5")
    counts = proc._get_num_multimodal_tokens(image_sizes=[(h, w) for w, h in SIZES])
    assert counts["num_image_tokens"] == [fam.image_token_count(w, h) for w, h in SIZES]
