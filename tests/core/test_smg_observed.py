"""mmlens' counts and worker-expandability against what the real SMG 1.13.0 did
(tests/fixtures/smg_observed_counts.json, recorded by `python -m mmlens.demo.probe_counts`)."""

import json
import math
from pathlib import Path

import pytest

from mmlens.layout.families import get_family
from mmlens.layout.imageinfo import parse_size

OBSERVED = json.loads(
    (Path(__file__).resolve().parent.parent / "fixtures" / "smg_observed_counts.json").read_text()
)
FAMILIES = [k for k in OBSERVED if not k.startswith("_")]


def test_the_fixture_covers_the_demo_families():
    assert set(FAMILIES) == {"qwen3-vl", "kimi-k3", "glm-5.3-flash"}


@pytest.mark.parametrize("family", FAMILIES)
def test_counts_equal_what_smg_expanded(family):
    entry = OBSERVED[family]
    fam = get_family(entry["model_type"])
    assert fam.name == family
    config = {**entry["config_json"], **entry["processor_config"]}
    got = {size: fam.image_token_count(*parse_size(size), config) for size in entry["counts"]}
    assert got == entry["counts"]


def test_glm53_differs_from_hf_glm4v_only_where_rounding_up_changes_the_grid():
    entry = OBSERVED["glm-5.3-flash"]
    glm4v = get_family("glm-4v")
    for size, observed in entry["counts"].items():
        w, h = parse_size(size)
        grid_moves = any(round(x / 28) != math.ceil(x / 28) for x in (w, h))
        in_budget = 12544 <= 2 * (28 * round(w / 28)) * (28 * round(h / 28)) <= 11760000
        if glm4v.image_token_count(w, h) != observed:
            assert grid_moves, size
        elif grid_moves:
            assert not in_budget, size  # the min/max-pixels rescale took over
    assert entry["counts"]["640x480"] == 414 and glm4v.image_token_count(640, 480) == 391


@pytest.mark.parametrize("family", FAMILIES)
def test_worker_expandability_matches_smg_processing_reason(family):
    entry = OBSERVED[family]
    (sample,) = entry["worker_mode_probe"]["smg_mm_processing_total"]
    fam = get_family(family)
    if fam.smg_worker_expandable:
        assert (sample["mode"], sample["reason"]) == ("worker", "auto_uniform")
        assert entry["worker_mode_probe"]["worker_received_media_refs"] == 1
    else:
        assert (sample["mode"], sample["reason"]) == ("router", "model_not_opted_in")
        assert entry["worker_mode_probe"]["worker_received_media_refs"] == 0


def test_kimi_k3_placeholder_covers_the_whole_media_block():
    entry = OBSERVED["kimi-k3"]
    (placeholder,) = entry["mm_placeholders_640x480"]
    example = entry["expanded_example"]
    ids = example["prompt_ids"]
    begin, content, end = 163602, 163603, 163604
    dims_len = ids.index(content) - ids.index(begin) - 1
    assert placeholder["offset"] == ids.index(begin)
    assert placeholder["length"] == 414 + 3 + dims_len
    assert ids.index(end) == placeholder["offset"] + placeholder["length"] - 1
