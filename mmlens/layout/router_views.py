"""One request as each party sees it — the engine (HF semantics), SMG 1.13, Dynamo 1.6.1 —
and every difference between a router and the engine, named with its cause.

A view holds the party's rendering of the message, its image-token counts, the identities it
gives the images, its block hashes and its outcome: expand (router mode / exact MM routing),
fall back (Dynamo's text-prefix routing) or refuse (what the client would get: HTTP 400).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mmlens.layout.composition import ImageInput, Layout, Part, Span, SpanKind, View, compose
from mmlens.layout.content_keys import content_block_keys
from mmlens.layout.hashing import (
    block_hashes,
    dynamo_hash_hex,
    dynamo_mm_hash_url,
    dynamo_routing,
    smg_block_hashes,
    smg_identity,
)
from mmlens.layout.modeldir import Model
from mmlens.layout.report import content_identity
from mmlens.layout.routers import (
    OBSERVED,
    PIXEL_BUDGET_KEYS,
    SEMANTICS,
    SMG_TRANSPARENCY,
    Counted,
    Party,
    Rendering,
    count_images,
    count_rule,
    dynamo_outcome,
    present_keys,
    render_rule,
    smg_refusal,
)


@dataclass(frozen=True)
class ImageView:
    index: int
    width: int
    height: int
    tokens: int | None  # None: not counted (fallback) or refused
    refusal: str | None
    identity: str | None  # SMG: the forwarded mm_hashes entry; Dynamo: the 16-hex mm_hash
    pad_value: int | None  # Dynamo: the image's routing pad value
    offset: int  # where the image starts in the party's prompt (its run, or its anchor)


@dataclass(frozen=True)
class PartyView:
    party: Party
    semantics: str
    outcome: str  # expand | router_mode | exact | fallback | refuse | unsupported
    reason: str | None
    observed: bool  # the rules were checked on the real binary for this family
    rendering: str
    rendered_ids: tuple[int, ...]  # the message rendered, one anchor per image
    prompt_tokens: int | None  # after expansion (what the engine reports as prompt_tokens)
    routed_tokens: int | None  # what the party routes on (Dynamo: padded to a block multiple)
    images: tuple[ImageView, ...]
    block_hashes: tuple[str, ...]
    config_reads: tuple[str, ...]
    params: dict[str, Any] | None
    notes: tuple[str, ...]
    layout: Layout | None


@dataclass(frozen=True)
class Difference:
    party: Party
    cause: str  # part order | chat format | text join | config key | rounding | refusal | ...
    detail: str
    image_index: int | None = None


@dataclass(frozen=True)
class RouterViews:
    engine: PartyView
    smg: PartyView
    dynamo: PartyView
    differences: tuple[Difference, ...]

    def parties(self) -> tuple[PartyView, ...]:
        return (self.engine, self.smg, self.dynamo)


def model_type_of(model: Model) -> str:
    value = model.config.get("model_type") if model.config else None
    return value if isinstance(value, str) else model.family.model_types[0]


def _is_image(part: Any) -> bool:
    return isinstance(part, ImageInput)


def _layout(model: Model, rendering: Rendering, counts: Sequence[int],
            block_size: int) -> Layout:
    kwargs: dict[str, Any] = {"counts": counts, "block_size": block_size,
                              "processor_config": model.processor_config}
    if rendering.chat is not None:
        family = dataclasses.replace(model.family, chat=rendering.chat)
        return compose(family, list(rendering.parts), model.tokenizer, **kwargs)
    return model.layout(list(rendering.parts), **kwargs)


def _offsets(layout: Layout | None, rendered: View) -> list[int]:
    """Where each image starts: its run in the expanded prompt, else its anchor."""
    if layout is not None:
        return [(layout.router.image_spans(i) or [Span(SpanKind.IMAGE, -1, 0)])[0].start
                for i in range(len(layout.images))]
    return [s.start for s in rendered.spans if s.image_index is not None]


def _params(p: Any) -> dict[str, Any] | None:
    if dataclasses.is_dataclass(p) and not isinstance(p, type):
        return dataclasses.asdict(p)
    return None


def _identity(party: Party, family_name: str, image: ImageInput) -> tuple[str | None, int | None]:
    if party is Party.SMG and image.data is not None:
        return smg_identity(image.data, SMG_TRANSPARENCY.get(family_name)), None
    if party is Party.DYNAMO and image.url is not None:
        h = dynamo_mm_hash_url(image.url)
        return dynamo_hash_hex(h), h
    return None, None


def party_view(party: Party, model: Model, parts: Sequence[Part], block_size: int,
               dynamo_backend: str = "default") -> PartyView:
    family = model.family
    rendering = render_rule(party, family, parts, _is_image, dynamo_backend)
    images = [p for p in rendering.parts if isinstance(p, ImageInput)]
    rule = count_rule(party, family)
    smg_reason = smg_refusal(family) if party is Party.SMG else None
    verdict = (dynamo_outcome(family, dynamo_backend, model_type_of(model))
               if party is Party.DYNAMO else
               ("refuse", smg_reason) if smg_reason else None)
    reason = verdict[1] if verdict else None
    rendered = _layout(model, rendering, [1] * len(images), block_size).anchor
    config_note, params = None, None
    counted: tuple[Counted, ...] = tuple(Counted(None) for _ in images)
    if rule is not None and not reason:
        pc = count_images(rule, family, [(i.width, i.height) for i in images],
                          model.processor_config, len(rendered) - len(images))
        counted, config_note, params = pc.counts, pc.config_note, pc.params
    refused = [c.refusal for c in counted if c.refusal]
    expanded = rule is not None and not reason and not refused
    layout = (_layout(model, rendering, [c.tokens or 0 for c in counted], block_size)
              if expanded else None)
    outcome, reason = _outcome(party, verdict, refused)
    offsets = _offsets(layout, rendered)
    idents = [_identity(party, family.name, img) for img in images]
    mm_hashes = [h for _, h in idents]
    pads = _pad_values(party, layout, mm_hashes)
    views = tuple(
        ImageView(i, img.width, img.height, c.tokens, c.refusal, idents[i][0], pads[i],
                  offsets[i])
        for i, (img, c) in enumerate(zip(images, counted, strict=True)))
    hashes, routed = _hashes(party, layout, rendered, block_size, images, mm_hashes,
                             outcome)
    notes = tuple(n for n in (config_note, _mode_note(party, family)) if n)
    return PartyView(
        party=party, semantics=SEMANTICS[party], outcome=outcome, reason=reason,
        observed=party is Party.ENGINE or family.name in OBSERVED[party],
        rendering=rendering.note, rendered_ids=rendered.token_ids,
        prompt_tokens=len(layout.router) if layout is not None else None,
        routed_tokens=routed, images=views, block_hashes=tuple(hashes),
        config_reads=rule.reads if rule else (), params=_params(params), notes=notes,
        layout=layout)


def _pad_values(party: Party, layout: Layout | None,
                mm_hashes: Sequence[int | None]) -> list[int | None]:
    if party is not Party.DYNAMO or layout is None or any(h is None for h in mm_hashes):
        return [None] * len(mm_hashes)
    return list(dynamo_routing(layout, [h for h in mm_hashes if h is not None]).pad_values)


def _outcome(party: Party, verdict: tuple[str, str] | None,
             refused: list[str]) -> tuple[str, str | None]:
    if verdict is not None:
        kind, reason = verdict
        if kind == "fallback":
            return "fallback", f"text-prefix routing: {reason}"
        if party is Party.SMG and not reason.startswith("HTTP"):
            return "unsupported", reason
        return "refuse", reason
    if refused:
        status = {Party.ENGINE: "HTTP 400: the engine's processor refuses the image",
                  Party.SMG: "HTTP 400 multimodal_processing_failed",
                  Party.DYNAMO: "HTTP 400"}[party]
        return "refuse", f"{status} ({refused[0]})"
    return {Party.ENGINE: "expand", Party.SMG: "router_mode", Party.DYNAMO: "exact"}[party], None


def _mode_note(party: Party, family: Any) -> str | None:
    if party is Party.SMG and family.smg_worker_expandable:
        return ("with workers advertising mm_processor SMG switches to worker mode and routes "
                "on the unexpanded ids")
    return None


def _hashes(party: Party, layout: Layout | None, rendered: View, block_size: int,
            images: Sequence[ImageInput], mm_hashes: Sequence[int | None],
            outcome: str) -> tuple[list[str], int | None]:
    """The party's block hashes and the length it routes on."""
    if outcome == "fallback":  # Dynamo's text-prefix routing: the rendered ids
        ids = rendered.token_ids
        return [f"{h:016x}" for h in block_hashes(ids, block_size)], len(ids)
    if layout is None:
        return [], None
    bs = block_size
    if party is Party.ENGINE:
        idents = [content_identity(img, n) for n, img in enumerate(images)]
        return content_block_keys(layout.engine, idents, bs), len(layout.engine)
    if party is Party.SMG:
        return [f"{h:016x}" for h in smg_block_hashes(layout)], len(layout.router)
    if any(h is None for h in mm_hashes):  # a WxH image: no URL, so no mm_hash
        return [], -(-len(layout.router) // bs) * bs
    routing = dynamo_routing(layout, [h for h in mm_hashes if h is not None])
    return [f"{h:016x}" for h in routing.block_hashes], len(routing.routing_ids)


# --- differences ---------------------------------------------------------------------------

def router_views(model: Model, parts: Sequence[Part], *, block_size: int = 16,
                 dynamo_backend: str = "default") -> RouterViews:
    engine = party_view(Party.ENGINE, model, parts, block_size)
    smg = party_view(Party.SMG, model, parts, block_size)
    dynamo = party_view(Party.DYNAMO, model, parts, block_size, dynamo_backend)
    if engine.outcome == "refuse" and dynamo.outcome == "exact":
        dynamo = dataclasses.replace(dynamo, reason=f"routes, then the engine refuses: "
                                     f"{engine.reason}")
    diffs = [d for view in (smg, dynamo) for d in differences(engine, view, model)]
    return RouterViews(engine, smg, dynamo, tuple(diffs))


def differences(engine: PartyView, view: PartyView, model: Model) -> list[Difference]:
    """How `view` departs from the engine's, each with its cause."""
    out: list[Difference] = []
    party = view.party
    per_image = any(i.refusal for i in view.images)
    if view.reason and (view.outcome in ("fallback", "unsupported") or (
            view.outcome == "refuse" and engine.outcome != "refuse" and not per_image)):
        cause = {"fallback": "fallback", "refuse": "refusal", "unsupported": "unsupported"}
        out.append(Difference(party, cause[view.outcome], view.reason))
    if view.rendered_ids != engine.rendered_ids:
        out.append(_rendering_difference(engine, view))
    out += _config_differences(engine, view, model)
    for mine, eng in zip(view.images, engine.images, strict=True):
        if mine.tokens is None and eng.tokens is None:
            continue
        if mine.refusal and eng.tokens is not None:
            out.append(Difference(party, "refusal", f"image {mine.index} "
                                  f"({mine.width}x{mine.height}): {mine.refusal}; the engine "
                                  f"expands it to {eng.tokens}", mine.index))
        elif eng.refusal and mine.tokens is not None:
            out.append(Difference(party, "engine refuses", f"image {mine.index} "
                                  f"({mine.width}x{mine.height}): {party} counts {mine.tokens} "
                                  f"where the engine refuses ({eng.refusal})", mine.index))
        elif None not in (mine.tokens, eng.tokens) and mine.tokens != eng.tokens:
            out.append(Difference(party, _count_cause(view, engine, model), f"image "
                                  f"{mine.index} ({mine.width}x{mine.height}): {party} "
                                  f"{mine.tokens} tokens, engine {eng.tokens}", mine.index))
    for note in view.notes:
        if "defaults" in note:
            out.append(Difference(party, "defaults", note))
    return out


def _rendering_difference(engine: PartyView, view: PartyView) -> Difference:
    delta = len(view.rendered_ids) - len(engine.rendered_ids)
    moved = [f"image {m.index} at token {m.offset} (engine {e.offset})"
             for m, e in zip(view.images, engine.images, strict=True) if m.offset != e.offset]
    cause = ("part order" if "first" in view.rendering else
             "chat format" if "format" in view.rendering else "text join")
    parts = [view.rendering, f"{len(view.rendered_ids)} rendered tokens vs the engine's "
             f"{len(engine.rendered_ids)} ({delta:+d})", *moved]
    return Difference(view.party, cause, "; ".join(parts))


def _config_differences(engine: PartyView, view: PartyView, model: Model) -> list[Difference]:
    if not view.config_reads and view.outcome == "fallback":
        return []
    present = present_keys(model.processor_config)
    out = []
    ignored = [k for k in present if k in engine.config_reads and k not in view.config_reads]
    extra = [k for k in present if k in view.config_reads and k not in engine.config_reads]
    if ignored and view.config_reads:
        out.append(Difference(view.party, "ignored config key",
                              f"{view.party} ignores {', '.join(ignored)} (the engine reads "
                              f"{'it' if len(ignored) == 1 else 'them'}); it uses "
                              f"{_budget(view.params)}"))
    if extra:
        out.append(Difference(view.party, "config key the engine ignores",
                              f"{view.party} reads {', '.join(extra)}, the engine does not "
                              f"(engine budget {_budget(engine.params)}, {view.party} "
                              f"{_budget(view.params)})"))
    unread = [k for k in present if k in PIXEL_BUDGET_KEYS
              and k not in view.config_reads and k not in engine.config_reads]
    if unread and view.party is Party.SMG:
        out.append(Difference(view.party, "config key read by neither",
                              f"{', '.join(unread)} set in the processor config but read by "
                              "neither the engine's processor nor SMG"))
    return out


def _budget(params: dict[str, Any] | None) -> str:
    if not params:
        return "its defaults"
    keys = [k for k in ("min_pixels", "max_pixels", "in_patch_limit") if k in params]
    return ", ".join(f"{k} {params[k]}" for k in keys) or "its defaults"


def _count_cause(view: PartyView, engine: PartyView, model: Model) -> str:
    present = present_keys(model.processor_config)
    if any((k in view.config_reads) != (k in engine.config_reads) for k in present):
        return "config key"
    if view.params != engine.params:
        return "defaults"
    return "rounding"
