"""What each party does with one request, family by family: the engine (HF processor
semantics), SMG 1.13 (gRPC router mode) and Dynamo 1.6.1 (frontend KV router).

Per party and family: how it counts an image (and which processor-config keys it reads), how
it renders the message's parts, how it names an image, and whether it expands, falls back or
refuses. Rules marked observed were checked on the real binaries over a few hundred image
sizes per family (tests/fixtures/router_probes); the others follow the engine's rule or the
reference and say so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from mmlens.errors import LayoutError, ProcessorConfigError
from mmlens.layout import image_tokens as it
from mmlens.layout import processor_config as pc
from mmlens.layout.families import ChatFormat, Expansion, Family

Config = Mapping[str, Any] | None
HF_VERSION = "transformers 5.24"


class Party(StrEnum):
    ENGINE = "engine"
    SMG = "smg"
    DYNAMO = "dynamo"


SEMANTICS = {
    Party.ENGINE: f"HF processor semantics ({HF_VERSION}); the model's chat template",
    Party.SMG: "SMG 1.13 gRPC router mode: renders, expands and routes on the expanded ids",
    Party.DYNAMO: "Dynamo 1.6.1 frontend: routes on pad-value ids (exact MM routing) or on "
                  "the rendered text (fallback)",
}
OBSERVED = {Party.SMG: {"qwen3-vl", "glm-5.3-flash", "kimi-k3"},
            Party.DYNAMO: {"qwen3-vl", "glm-5.3-flash", "kimi-k3"}}
QWEN = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl")
BUDGET_KEYS = ("min_pixels", "max_pixels", "size.shortest_edge", "size.longest_edge",
               "min_image_tokens", "max_image_tokens", "patch_size", "merge_size",
               "temporal_patch_size", "media_proc_cfg.in_patch_limit",
               "media_proc_cfg.patch_limit_on_one_side")
PIXEL_BUDGET_KEYS = ("min_pixels", "max_pixels", "size.shortest_edge", "size.longest_edge",
                     "min_image_tokens", "max_image_tokens")
# SMG 1.13 keys an image by its bytes re-hashed with the family's transparency policy.
SMG_TRANSPARENCY = {"qwen3-vl": "composite_over_white", "glm-5.3-flash": "composite_over_white",
                    "kimi-k3": None}
SMG_QWEN2_REFUSAL = ("HTTP 400 invalid_multimodal_request: image placeholder token '<image>' "
                     "is missing from the tokenizer vocabulary (SMG 1.13 with a faithful "
                     "Qwen2-VL directory, per the reference)")
DYNAMO_BACKENDS = ("default", "basetenkenizer", "fastokens")


@dataclass(frozen=True)
class CountRule:
    """How one party turns a processor config and an image size into N."""

    params: Callable[[Config], Any]
    count: Callable[[int, int, Any], int]
    reads: tuple[str, ...]  # the budget/grid keys of BUDGET_KEYS it honours
    bad_config_defaults: bool = False  # a wrongly typed value: defaults (SMG) or refusal
    defaults: Any = None


def _family_rule(family: Family, reads: tuple[str, ...]) -> CountRule:
    return CountRule(family.params, family.count, reads)


def _dynamo_qwen_count(width: int, height: int, p: it.QwenParams) -> int:
    """Dynamo's estimator: a side under half a grid cell counts as one cell, and an image
    over 200:1 (which the HF processor refuses) counts 1 token."""
    it.check_size(width, height)
    if max(width, height) / min(width, height) > 200:
        return 1
    h_bar, w_bar = it.qwen_smart_resize(height, width, p.factor, p.min_pixels, p.max_pixels,
                                        at_least_one_cell=True)
    return (h_bar // p.factor) * (w_bar // p.factor)


def _glm5_hf(cfg: Config) -> it.Glm5Params:
    return pc.glm5_hf_params(cfg or {}, it.Glm5Params())


def _glm53_smg(cfg: Config) -> it.Glm5Params:
    return pc.glm53_params(cfg or {}, it.Glm5Params())


QWEN_READS = ("min_pixels", "max_pixels", "size.shortest_edge", "size.longest_edge",
              "patch_size", "merge_size")
GLM4V_READS = ("size.shortest_edge", "size.longest_edge", "min_pixels", "max_pixels",
               "patch_size", "merge_size", "temporal_patch_size")
KIMI_READS = ("media_proc_cfg.in_patch_limit", "media_proc_cfg.patch_limit_on_one_side",
              "patch_size")


def count_rule(party: Party, family: Family) -> CountRule | None:
    """None: the party does not count this family's images (Dynamo's text-prefix fallback)."""
    name = family.name
    if name in QWEN:
        if party is Party.DYNAMO:
            return CountRule(family.params, _dynamo_qwen_count, QWEN_READS)
        return _family_rule(family, QWEN_READS)
    if name == "glm-5.3-flash":
        if party is Party.ENGINE:
            return CountRule(_glm5_hf, it.glm5_tokens,
                             ("min_image_tokens", "max_image_tokens", "patch_size",
                              "merge_size", "temporal_patch_size"))
        if party is Party.SMG:
            return CountRule(_glm53_smg, it.glm5_tokens,
                             ("min_pixels", "max_pixels", "min_image_tokens",
                              "max_image_tokens", "patch_size", "merge_size",
                              "temporal_patch_size"),
                             bad_config_defaults=True,
                             defaults=replace(it.Glm5Params(), max_aspect=200))
        return None
    if party is Party.DYNAMO and family.dynamo_prompt_kind is None:
        return None
    if name == "kimi-k2.5" and party is Party.DYNAMO:
        # The reference: Dynamo's Kimi-K2 estimator ignores media_proc_cfg (16384/512 fixed).
        fixed = it.KimiParams(in_patch_limit=16_384, patch_limit_on_one_side=512)
        return CountRule(lambda cfg: fixed, family.count, ())
    if name.startswith("kimi"):
        return _family_rule(family, KIMI_READS)
    if name == "glm-4v":
        return _family_rule(family, GLM4V_READS)
    return _family_rule(family, ())


@dataclass(frozen=True)
class Counted:
    tokens: int | None
    refusal: str | None = None


@dataclass(frozen=True)
class PartyCounts:
    counts: tuple[Counted, ...]
    config_note: str | None = None  # e.g. "wrongly typed value: SMG uses its defaults"
    params: Any = None


def count_images(rule: CountRule, family: Family, sizes: Sequence[tuple[int, int]],
                 config: Config, text_len: int) -> PartyCounts:
    note = None
    try:
        params = rule.params(config)
    except ProcessorConfigError as exc:
        if not rule.bad_config_defaults:
            return PartyCounts(tuple(Counted(None, f"processor config: {exc}") for _ in sizes))
        params, note = rule.defaults, f"{exc}: SMG ignores the processor config, uses defaults"
    if family.expansion is Expansion.WRAPPED_PAD_RUN:
        try:
            counts = it.nemotron_request_tokens(list(sizes), text_len, params)
        except LayoutError as exc:
            return PartyCounts(tuple(Counted(None, str(exc)) for _ in sizes), note, params)
        return PartyCounts(tuple(Counted(n) for n in counts), note, params)
    out = []
    for w, h in sizes:
        try:
            out.append(Counted(rule.count(w, h, params)))
        except LayoutError as exc:
            out.append(Counted(None, str(exc)))
    return PartyCounts(tuple(out), note, params)


def present_keys(config: Config) -> list[str]:
    """The budget/grid keys a processor config sets (dotted paths)."""
    if not config:
        return []
    return [k for k in BUDGET_KEYS if pc.lookup(config, k) is not None]


# --- rendering ----------------------------------------------------------------------------

K3_OPEN, K3_SEP, K3_CLOSE, K3_END = "<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>"
K3_THINKING = ("`thinking_effort` guides on how much to think in your thinking channel (not "
               "including the response channel), supported values include `low`, `medium`, "
               "`high`, and `max`.\nNow the system is invoked with `thinking_effort=max`.")
# Dynamo 1.6.1 with --tokenizer basetenkenizer renders Kimi-K3 with this built-in format, not
# the model's chat template (observed: the frontend's formatted_prompt).
DYNAMO_K3_CHAT = ChatFormat(
    bos=(f'{K3_OPEN}message role="system" type="thinking-effort"{K3_SEP}{K3_THINKING}'
         f"{K3_CLOSE}message{K3_SEP}{K3_END}"),
    user_prefix=f'{K3_OPEN}message role="user"{K3_SEP}',
    user_suffix=f"{K3_CLOSE}message{K3_SEP}{K3_END}",
    assistant_prefix=f'{K3_OPEN}message role="assistant"{K3_SEP}{K3_OPEN}think{K3_SEP}',
    image="<|media_pad|>",
)


@dataclass(frozen=True)
class Rendering:
    parts: tuple[Any, ...]  # text strings and images, in the order the party renders them
    chat: ChatFormat | None  # a format replacing the model's chat template
    note: str


def render_rule(party: Party, family: Family, parts: Sequence[Any], is_image: Callable[[Any], bool],
                dynamo_backend: str = "default") -> Rendering:
    texts = [p for p in parts if not is_image(p)]
    images = [p for p in parts if is_image(p)]
    if party is Party.SMG and family.name in QWEN:
        return Rendering((*images, "".join(texts)) if texts else tuple(images), None,
                         "SMG renders every image part first, then the text parts joined")
    if party is Party.DYNAMO and family.name == "kimi-k3":
        joined = (("".join(texts),) if texts and not images else tuple(parts))
        return Rendering(joined, DYNAMO_K3_CHAT,
                         "Dynamo's built-in Kimi-K3 format (thinking-effort system message, "
                         "<|open|>/<|sep|> markers, an opened think block), not the model's "
                         "chat template")
    if party is Party.DYNAMO and not images and len(texts) > 1:
        return Rendering(("\n".join(texts),), None,
                         "Dynamo joins a message of text parts only with newlines")
    return Rendering(tuple(parts), None, "the model's chat template, parts in order")


# --- outcome -------------------------------------------------------------------------------

K3_SEGMENTED = ("HTTP 500 Failed to generate completions: Failed to gather tokens: tokenizer "
                "backend does not support segmented encoding (every Kimi-K3 request, text "
                "only too; Kimi-K3 needs --tokenizer basetenkenizer)")


def dynamo_outcome(family: Family, backend: str,
                   model_type: str | None = None) -> tuple[str, str] | None:
    """("fallback", why) when Dynamo routes this family on the rendered text only,
    ("refuse", what the client gets) when it fails the request, None for exact routing."""
    if family.name == "kimi-k3" and backend == "default":
        return "refuse", K3_SEGMENTED
    if backend == "fastokens":
        return "fallback", ("the fastokens tokenizer backend disables MM-aware KV routing for "
                            "every model")
    if family.dynamo_prompt_kind is None:
        if family.name.startswith("glm"):
            return "fallback", (f"no image processor registered for "
                                f"{model_type or family.model_types[0]} (mm_routing: not "
                                "supported for MM-aware KV routing)")
        return "fallback", "no image placeholder resolved for this family"
    return None


def smg_refusal(family: Family) -> str | None:
    if family.name in ("qwen2-vl", "qwen2.5-vl"):
        return SMG_QWEN2_REFUSAL
    if family.smg_spec is None:
        return "no SMG 1.13 multimodal spec for this family"
    return None


def blocks(length: int, block_size: int) -> int:
    return math.ceil(length / block_size) if length else 0
