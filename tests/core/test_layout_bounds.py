"""Processor-config values and image sizes beyond any real checkpoint are refused with a clear
error before a formula runs, and the refusal costs the same whatever the value."""

from __future__ import annotations

import json
import time

import pytest

from mmlens.errors import ImageError, ProcessorConfigError
from mmlens.layout.families import get_family
from mmlens.layout.imageinfo import parse_size
from mmlens.layout.modeldir import read_json


@pytest.mark.parametrize(("family", "config", "message"), [
    ("qwen2.5-vl", {"patch_size": float("inf")}, "must be an integer"),
    ("qwen2.5-vl", {"patch_size": float("nan")}, "must be an integer"),
    ("qwen2.5-vl", {"patch_size": 10**6}, "beyond the limit"),
    ("qwen2.5-vl", {"max_pixels": 10**40}, "beyond the limit"),
    ("llava-next", {"patch_size": 400}, "larger than the image size"),
    ("llava-next", {"crop_size": {"height": 1124}}, "smaller than one"),
    ("llava-next", {"num_additional_image_tokens": [1]}, "0..16"),
    ("llava-next", {"image_grid_pinpoints": [[336, 672]] * 300}, "at most 256"),
    ("llama-4", {"max_patches": 10**30}, "beyond the limit"),
    ("llama-4", {"vision_config": {"pixel_shuffle_ratio": float("inf")}}, "(0, 1]"),
    ("llama-4", {"vision_config": {"patch_size": 400}}, "no token per tile"),
    ("kimi-k2.5", {"media_proc_cfg": {"patch_size": float("-inf")}}, "must be an integer"),
])
def test_absurd_processor_values_are_refused(family: str, config: dict, message: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ProcessorConfigError, match=message.replace("(", r"\(")
                       .replace(")", r"\)").replace("]", r"\]")):
        get_family(family).image_token_count(1280, 720, config)
    assert time.perf_counter() - started < 0.05


def test_largest_accepted_tile_budget_is_still_cheap() -> None:
    started = time.perf_counter()
    assert get_family("llama-4").image_token_count(1280, 720, {"max_patches": 1024}) > 0
    assert time.perf_counter() - started < 0.5


def test_sizes_with_thousands_of_digits_are_refused_quickly() -> None:
    started = time.perf_counter()
    with pytest.raises(ImageError, match="exceeds"):
        parse_size("9" * 5000 + "x480")
    assert time.perf_counter() - started < 0.05
    assert parse_size("640x480") == (640, 480)


def test_processor_json_that_python_cannot_read_is_a_config_error(tmp_path) -> None:
    for text in ('{"patch_size": ' + "1" * 5000 + "}", "[" * 100_000 + "]" * 100_000,
                 b"\xff\xfe{}".decode("latin-1")):
        path = tmp_path / "preprocessor_config.json"
        path.write_text(text)
        with pytest.raises(ProcessorConfigError, match="not valid JSON"):
            read_json(path)
    path.write_text(json.dumps({"patch_size": 14}))
    assert read_json(path) == {"patch_size": 14}
