"""A model directory's chat template rendered with jinja2 the way transformers renders it
(sandboxed, blocks trimmed, loop controls, a ``tojson`` that leaves non-ASCII alone,
``raise_exception`` and ``strftime_now``; the tokenizer's special tokens in scope), without
importing transformers (over a second per call)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                      "cls_token", "mask_token")


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def template_source(folder: Path, tokenizer_config: dict[str, Any]) -> str | None:
    """The directory's default chat template: chat_template.jinja, else tokenizer_config's
    ``chat_template`` (a string, or a list of named templates holding ``default``)."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    found = tokenizer_config.get("chat_template")
    if isinstance(found, list):
        named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
        found = named.get("default")
    return found if isinstance(found, str) else None


class ChatTemplate:
    """``apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`` for one
    template source."""

    def __init__(self, source: str, tokenizer_config: dict[str, Any]) -> None:
        from jinja2 import ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.chat_template = source
        self._template = env.from_string(source)
        self._specials = {k: t for k in SPECIAL_TOKEN_KEYS
                          if (t := _token_text(tokenizer_config.get(k))) is not None}

    def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool = False,
                            add_generation_prompt: bool = False, **kwargs: Any) -> str:
        if tokenize:
            raise ValueError("this renderer returns text only")
        return self._template.render(messages=messages, tools=None, documents=None,
                                     add_generation_prompt=add_generation_prompt,
                                     **self._specials, **kwargs)
