"""Weight-free model directories for the demo models, generated offline at run time.

Each directory holds what SMG and the simulated worker read: tokenizer files, `config.json`,
the processor config and a chat template that emits the family's anchor for image parts.
Directories are cached under a version key, so a warm start costs a stat.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmlens.layout import tokenizers
from mmlens.layout.families import Family, get_family

FORMAT_VERSION = "4"

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


@dataclass(frozen=True)
class DemoModel:
    """One demo model: its family key, served name and the files of its directory."""

    family: str
    served_name: str
    config: dict[str, Any]
    processor_config: dict[str, Any]
    processor_file: str = "preprocessor_config.json"

    @property
    def dir_name(self) -> str:
        return self.served_name.rsplit("/", 1)[-1]

    @property
    def model_type(self) -> str:
        return str(self.config["model_type"])

    @property
    def core(self) -> Family:
        return get_family(self.family)

    @property
    def chat_template(self) -> str:
        return self.core.chat.jinja()

    def token_id(self, token: str) -> int:
        return self.core.special_ids[token]

    def ready_entry(self, model_dir: Path | None) -> dict[str, str]:
        """How a demo's ready line describes this model, generated at `model_dir`."""
        return {"id": self.served_name, "family": self.family, "model_type": self.model_type,
                "path": str(model_dir)}


MODELS: dict[str, DemoModel] = {m.family: m for m in (
    DemoModel(
        family="qwen3-vl",
        served_name="Qwen/Qwen3-VL-2B-Instruct",
        config={
            "architectures": ["Qwen3VLForConditionalGeneration"],
            "model_type": "qwen3_vl",
            "image_token_id": 151655,
            "video_token_id": 151656,
            "vision_start_token_id": 151652,
            "vision_end_token_id": 151653,
            "vision_config": {"patch_size": 16, "spatial_merge_size": 2,
                              "temporal_patch_size": 2},
            "text_config": {"vocab_size": 151936, "max_position_embeddings": 32768},
            "vocab_size": 151936,
            "max_position_embeddings": 32768,
            "eos_token_id": 151645,
            "bos_token_id": 151643,
            "torch_dtype": "bfloat16",
        },
        processor_config={
            "image_processor_type": "Qwen2VLImageProcessorFast",
            "processor_class": "Qwen3VLProcessor",
            "patch_size": 16,
            "merge_size": 2,
            "temporal_patch_size": 2,
            "size": {"shortest_edge": 65536, "longest_edge": 16777216},
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
        },
    ),
    DemoModel(
        family="kimi-k3",
        served_name="moonshotai/Kimi-K3",
        config={
            "architectures": ["KimiK3ForConditionalGeneration"],
            "model_type": "kimi_k3",
            "media_placeholder_token_id": 163605,
            "vocab_size": 163840,
            "max_position_embeddings": 131072,
            "bos_token_id": 163584,
            "eos_token_id": 163585,
            "pad_token_id": 163839,
            "vision_config": {"patch_size": 14, "merge_kernel_size": [2, 2]},
            "torch_dtype": "bfloat16",
        },
        processor_config={
            "media_proc_cfg": {
                "in_patch_limit": 65536,
                "patch_size": 14,
                "merge_kernel_size": [2, 2],
                "patch_limit_on_one_side": 512,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
            },
        },
    ),
    DemoModel(
        family="glm-5.3-flash",
        served_name="zai-org/GLM-5.3-Flash",
        config={
            "architectures": ["Glm53FlashForConditionalGeneration"],
            "model_type": "glm53_flash",
            "image_token_id": 151363,
            "video_token_id": 151364,
            "image_start_token_id": 151339,
            "image_end_token_id": 151340,
            "vocab_size": 151552,
            "max_position_embeddings": 131072,
            "eos_token_id": 151329,
            "pad_token_id": 151329,
            "vision_config": {"patch_size": 14, "spatial_merge_size": 2,
                              "temporal_patch_size": 2},
            "torch_dtype": "bfloat16",
        },
        processor_config={
            "min_pixels": 12544,
            "max_pixels": 11760000,
            "patch_size": 14,
            "merge_size": 2,
            "temporal_patch_size": 2,
            "image_mean": CLIP_MEAN,
            "image_std": CLIP_STD,
        },
    ),
)}


def default_cache_root() -> Path:
    return tokenizers.cache_dir() / "demo-models"


def _write(model: DemoModel, out: Path) -> None:
    if model.core.tokenizer == "qwen":
        src = tokenizers.qwen_tokenizer_files()
        for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
            if (src / name).exists():
                shutil.copy(src / name, out / name)
    else:
        tokenizers.write_shape_faithful_tokenizer(model.family, out)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = model.chat_template
    cfg_path.write_text(json.dumps(cfg, indent=1, ensure_ascii=False))
    (out / "config.json").write_text(json.dumps(model.config, indent=1))
    (out / model.processor_file).write_text(json.dumps(model.processor_config, indent=1))
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": model.config["eos_token_id"]}))


def ensure_model_dir(family: str, root: Path | None = None) -> Path:
    """Return the directory of a demo model, generating it on first use."""
    model = MODELS[family]
    root = root or default_cache_root()
    target = root / f"v{FORMAT_VERSION}" / model.dir_name
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model.dir_name}-", dir=target.parent))
    try:
        _write(model, tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
