import io
import json
import subprocess
import sys

import pytest
from PIL import Image

from mmlens.cli.main import main
from mmlens.layout.families import FAMILIES

from .test_modeldir import write_dir

REQUIRED = {"family", "block_size", "images", "router_view", "worker_view",
            "engine_prompt_tokens", "spans"}


def run_json(capsys, *args):
    assert main(["layout", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("family", [f.name for f in FAMILIES])
def test_json_fields_for_every_family(family, capsys, tmp_path):
    model = family
    if family == "glm-5.3-flash":
        model = str(write_dir(tmp_path / "GLM-5.3-Flash", family, {"model_type": "glm53_flash"},
                              {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14}))
    out = run_json(capsys, "--model", model, "--image", "640x480", "--text", "Compare",
                   "--image", "64x64", "--block-size", "16")
    assert REQUIRED <= out.keys()
    assert out["family"] == family and out["block_size"] == 16
    assert [(i["width"], i["height"]) for i in out["images"]] == [(640, 480), (64, 64)]
    router = out["router_view"]["token_count"]
    assert router == sum(s["length"] for s in out["spans"])
    assert out["router_view"]["full_blocks"] == router // 16
    assert out["worker_view"]["token_count"] < router
    image_spans = [s for s in out["spans"] if s["kind"] == "image"]
    for idx, img in enumerate(out["images"]):
        assert img["tokens"] == sum(s["length"] for s in image_spans if s["image_index"] == idx)


def test_qwen3_counts_in_json(capsys):
    out = run_json(capsys, "--model", "qwen3-vl", "--image", "64x64", "--text",
                   "Describe this image in detail please.")
    assert out["images"][0]["tokens"] == 64
    assert out["router_view"] == {"token_count": 81, "full_blocks": 5, "partial_block_tokens": 1}
    assert out["worker_view"] == {"token_count": 18}
    assert out["engine_prompt_tokens"] == 81


def test_image_file_gives_identities_and_dynamo_view(capsys, tmp_path):
    path = tmp_path / "red.png"
    Image.new("RGB", (64, 64), (255, 0, 0)).save(path)
    out = run_json(capsys, "--model", "qwen3-vl", "--image", str(path), "--text", "hi")
    ident = out["images"][0]["identity"]
    assert len(ident["smg"]) == 64 and isinstance(ident["dynamo_mm_hash"], int)
    dyn = out["routers"]["dynamo"]
    assert dyn["total_tokens"] % 16 == 0 and dyn["routing_blocks"] == dyn["total_tokens"] // 16


def test_human_table(capsys):
    assert main(["layout", "--model", "kimi-k3", "--image", "640x480", "--text", "hi"]) == 0
    out = capsys.readouterr().out
    assert "image 0: 640x480 -> 414 image tokens" in out
    assert "synthetic tokenizer" in out
    assert "model_not_opted_in" not in out and "worker-expandable: no" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "nope", "--image", "64x64"], "unknown model family"),
    (["--model", "qwen3-vl", "--image", "0x64"], "must be positive"),
    (["--model", "llava-1.5", *["--image", "64x64"] * 5], "at most 4 images"),
    (["--model", "qwen3-vl", "--image", "no-such-file.png"], "neither WxH"),
    (["--model", "glm-5.3-flash", "--image", "64x64"], "processor config"),
])
def test_bad_input_is_a_clear_error(args, message, capsys):
    assert main(["layout", *args]) == 2
    assert message in capsys.readouterr().err


def test_non_image_file_is_refused(tmp_path, capsys):
    path = tmp_path / "page.png"
    path.write_bytes(b"<html>hello</html>")
    assert main(["layout", "--model", "qwen3-vl", "--image", str(path)]) == 2
    assert "not a readable image" in capsys.readouterr().err


def test_truncated_image_file_is_refused(tmp_path, capsys):
    buf = io.BytesIO()
    Image.new("RGB", (300, 300), (1, 2, 3)).save(buf, format="JPEG")
    path = tmp_path / "cut.jpg"
    path.write_bytes(buf.getvalue()[:500])
    assert main(["layout", "--model", "qwen3-vl", "--image", str(path)]) == 2
    assert "truncated" in capsys.readouterr().err


def test_console_entry_point_runs_as_a_module():
    proc = subprocess.run(
        [sys.executable, "-m", "mmlens", "layout", "--model", "qwen3-vl", "--image",
         "1280x720", "--json"], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(proc.stdout)["images"][0]["tokens"] == 880


def test_extreme_aspect_gives_each_party_s_outcome_not_a_bare_refusal(capsys):
    assert main(["layout", "--model", "qwen3-vl", "--image", "30000x20", "--json"]) == 0
    captured = capsys.readouterr()
    assert "aspect ratio" in captured.err
    out = json.loads(captured.out)
    assert "aspect ratio" in out["layout_error"]
    views = out["views"]
    assert views["engine"]["outcome"] == views["smg"]["outcome"] == "refuse"
    assert views["dynamo"]["outcome"] == "exact"
    assert views["dynamo"]["images"][0]["tokens"] == 1


def test_views_in_json_and_table(capsys, tmp_path):
    path = tmp_path / "red.png"
    Image.new("RGB", (64, 64), (255, 0, 0)).save(path)
    args = ["--model", "qwen3-vl", "--text", "Compare", "--image", str(path), "--text", "ok"]
    out = run_json(capsys, *args)
    assert REQUIRED <= out.keys()
    views = out["views"]
    assert {"engine", "smg", "dynamo", "differences"} <= views.keys()
    for party in ("engine", "smg", "dynamo"):
        v = views[party]
        assert {"outcome", "rendering", "rendered_tokens", "prompt_tokens", "routed_tokens",
                "images", "block_hashes", "observed"} <= v.keys()
    assert views["smg"]["images"][0]["identity"] == out["images"][0]["identity"]["smg"]
    assert views["smg"]["images"][0]["offset"] == 4 and views["engine"]["images"][0]["offset"] == 5
    assert [d["cause"] for d in views["differences"]] == ["part order"]
    assert views["dynamo"]["routing_blocks"] == views["dynamo"]["routed_tokens"] // 16
    assert main(["layout", *args]) == 0
    table = capsys.readouterr().out
    assert "per-router views" in table and "part order" in table


def test_dynamo_tokenizer_option(capsys):
    args = ["--model", "kimi-k3", "--image", "640x480", "--text", "hi"]
    assert run_json(capsys, *args)["views"]["dynamo"]["outcome"] == "refuse"
    out = run_json(capsys, *args, "--dynamo-tokenizer", "basetenkenizer")
    assert out["views"]["dynamo"]["outcome"] == "exact"
    assert any(d["cause"] == "chat format" for d in out["views"]["differences"])
