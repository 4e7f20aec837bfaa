"""A model to lay out requests for: a family name or id, or a local model directory.

A directory supplies config.json (family detection), its processor config
(preprocessor_config.json, or processor_config.json's `image_processor`, flat or nested),
its tokenizer (through transformers) and its chat template.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmlens.errors import LayoutError, ProcessorConfigError
from mmlens.layout.composition import ImageInput, Layout, Part, build_layout, compose
from mmlens.layout.families import Family, family_from_config, get_family
from mmlens.layout.tokenizers import TextTokenizer, family_tokenizer, model_dir_tokenizer


@dataclass(frozen=True)
class Model:
    family: Family
    tokenizer: TextTokenizer
    processor_config: Mapping[str, Any] | None
    path: Path | None = None
    chat_template: Any = None  # a transformers tokenizer able to render, when the dir has one
    config: Mapping[str, Any] = field(default_factory=dict)

    def layout(self, parts: Sequence[Part], **kwargs: Any) -> Layout:
        kwargs.setdefault("processor_config", self.processor_config)
        if self.chat_template is None:
            return compose(self.family, parts, self.tokenizer, **kwargs)
        images = [p for p in parts if isinstance(p, ImageInput)]
        content = [{"type": "image"} if isinstance(p, ImageInput) else {"type": "text", "text": p}
                   for p in parts]
        try:
            text = self.chat_template.apply_chat_template(
                [{"role": "user", "content": content}], tokenize=False,
                add_generation_prompt=True,
            )
        except Exception as exc:
            raise LayoutError(f"the model's chat template failed to render: {exc}") from exc
        return build_layout(self.family, self.tokenizer.encode(text), images, self.tokenizer,
                            **kwargs)


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (ValueError, RecursionError) as exc:  # bad JSON, bad UTF-8, 4300+ digit numbers
        raise ProcessorConfigError(f"{path.name} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ProcessorConfigError(f"{path.name} must hold a JSON object")
    return data


def processor_config_of(path: Path, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """Merged image-processor settings: config.json's vision keys, then the processor files."""
    merged: dict[str, Any] = {}
    found = False
    for key in ("vision_config", "vision_feature_select_strategy", "image_grid_pinpoints",
                "max_model_len"):
        if key in config:
            merged[key] = config[key]
    pre = path / "preprocessor_config.json"
    if pre.is_file():
        merged.update(read_json(pre))
        found = True
    proc = path / "processor_config.json"
    if proc.is_file():
        data = read_json(proc)
        nested = data.get("image_processor")
        merged.update(nested if isinstance(nested, dict) else data)
        found = True
    return merged if found or merged else None


def load_model_dir(path: str | Path) -> Model:
    folder = Path(path)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise LayoutError(f"{folder} has no config.json")
    config = read_json(cfg_path)
    family = family_from_config(config, model_id=folder.name)
    proc = processor_config_of(folder, config)
    if family.requires_processor_config and not (
        (folder / "preprocessor_config.json").is_file()
        or (folder / "processor_config.json").is_file()
    ):
        raise ProcessorConfigError(
            f"{family.display}: {folder.name} has no preprocessor_config.json or "
            "processor_config.json; image-token counts are not guessed"
        )
    tokenizer = model_dir_tokenizer(str(folder))
    renderer = tokenizer.hf if getattr(tokenizer.hf, "chat_template", None) else None
    # Fail now, with the file named, rather than on the first request.
    family.params(proc)
    return Model(family, tokenizer, proc, folder, renderer, config)


def resolve_model(model: str) -> Model:
    """A model directory when `model` is one, else a family name, model_type or model id."""
    if Path(model).is_dir():
        return load_model_dir(model)
    family = get_family(model)
    family.params(None)
    return Model(family, family_tokenizer(family.name), None)
