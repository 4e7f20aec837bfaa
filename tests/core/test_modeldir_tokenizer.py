"""A model directory's tokenizer read straight from tokenizer.json and its chat template
rendered by jinja2 give what transformers gives, without transformers' cost or warnings."""

import json
import shutil
import subprocess
import sys

import pytest
from mmlens.demo.model_dirs import MODELS, ensure_model_dir

from mmlens.layout import tokenizers
from mmlens.layout.chat_template import ChatTemplate

TEXTS = ["Describe this image in detail please.", "two  spaces\n\n\ttab", "日本語 🙂 émoji",
         "<|im_start|>user\nhi<|im_end|>", " leading space", "x" * 300]
CONTENTS = [
    [{"type": "image"}, {"type": "text", "text": "Compare"}],
    [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "image"}],
    "plain string content",
]


@pytest.mark.parametrize("family", sorted(MODELS))
def test_direct_tokenizer_and_template_match_transformers(family):
    folder = str(ensure_model_dir(family))
    direct = tokenizers.model_dir_tokenizer(folder)
    assert isinstance(direct.hf, ChatTemplate)
    hf = tokenizers._transformers_tokenizer(folder, direct.synthetic, direct.source)
    assert not isinstance(hf.hf, ChatTemplate)
    for text in TEXTS:
        assert direct.encode(text) == hf.encode(text)
    for content in CONTENTS:
        messages = [{"role": "user", "content": content}]
        for gen in (True, False):
            assert direct.hf.apply_chat_template(messages, add_generation_prompt=gen) == \
                hf.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    names = [e["content"] for e in json.loads(
        (ensure_model_dir(family) / "tokenizer_config.json").read_text()
    )["added_tokens_decoder"].values()]
    for name in [*names, "a", "not-a-token-at-all"]:
        assert direct.token_to_id_fn(name) == hf.token_to_id_fn(name)


def _set_class(cfg):
    cfg["tokenizer_class"] = "SomeSlowTokenizer"


def _add_config_only_token(cfg):
    cfg["added_tokens_decoder"]["999999"] = {"content": "<|only_in_config|>", "special": True}


@pytest.mark.parametrize("edit", [_set_class, _add_config_only_token])
def test_other_classes_and_config_only_tokens_go_through_transformers(tmp_path, edit):
    src = ensure_model_dir("kimi-k3")
    folder = tmp_path / "dir"
    shutil.copytree(src, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    edit(cfg)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = tokenizers.model_dir_tokenizer(str(folder))
    assert not isinstance(tok.hf, ChatTemplate)
    assert tok.encode("Describe this") == tokenizers.model_dir_tokenizer(str(src)).encode(
        "Describe this")


@pytest.mark.parametrize("family", ["qwen3-vl", "kimi-k3"])
def test_layout_of_a_model_dir_is_quiet_and_leaves_transformers_and_pil_unimported(family):
    code = ("import sys; from mmlens.cli.main import main; "
            f"rc = main(['layout', '--model', {str(ensure_model_dir(family))!r}, "
            "'--image', '640x480']); "
            "heavy = sorted(m for m in ('transformers', 'PIL') if m in sys.modules); "
            "print(heavy or 'CLEAN'); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("CLEAN")
    assert done.stderr == ""
