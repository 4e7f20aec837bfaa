"""Plain-data summaries of a layout (the `--json` shape of `mmlens layout`) and its table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mmlens.layout.composition import ImageInput, Layout
from mmlens.layout.content_keys import layout_shapes
from mmlens.layout.families import Family
from mmlens.layout.hashing import (
    dynamo_mm_hash_url,
    dynamo_routing,
    smg_identifier,
    smg_identity,
)
from mmlens.layout.routers import SMG_TRANSPARENCY


def image_identity(image: ImageInput, family: str | None = None) -> dict[str, Any]:
    """The identity each router gives the image: SMG's forwarded identifier (re-keyed for
    the families that composite transparency over white) and Dynamo's mm_hash."""
    ident: dict[str, Any] = {"smg": None, "dynamo_mm_hash": None}
    if image.data is not None:
        ident["smg"] = smg_identity(image.data, SMG_TRANSPARENCY.get(family or ""))
    if image.url is not None:
        ident["dynamo_mm_hash"] = dynamo_mm_hash_url(image.url)
    return ident


def content_identity(image: ImageInput, index: int) -> str:
    """An engine-side identity: the bytes when known, else the URL, else a per-request label
    (two size-only images are never assumed equal)."""
    if image.data is not None:
        return smg_identifier(image.data)
    if image.url is not None:
        return f"url:{image.url}"
    return f"unknown:{image.width}x{image.height}#{index}"


def layout_summary(layout: Layout, family: Family, images: Sequence[ImageInput]) -> dict[str, Any]:
    full_blocks = len(layout.router) // layout.block_size
    summary: dict[str, Any] = {
        "family": layout.family,
        "block_size": layout.block_size,
        "tokenizer": layout.tokenizer_source,
        "synthetic_tokenizer": layout.synthetic_tokenizer,
        "images": [
            {"width": im.width, "height": im.height, "tokens": im.tokens,
             "expanded_length": im.expanded_length, "engine_tokens": im.engine_tokens,
             "identity": image_identity(src, family.name) | {"content": content_identity(src, n)}}
            for n, (im, src) in enumerate(zip(layout.images, images, strict=True))
        ],
        "anchor_view": {"token_count": len(layout.anchor)},
        "router_view": {"token_count": len(layout.router), "full_blocks": full_blocks,
                        "partial_block_tokens": len(layout.router) % layout.block_size},
        "worker_view": {"token_count": len(layout.worker)},
        "engine_prompt_tokens": layout.engine_prompt_tokens,
        "first_divergent_block": layout.first_divergent_block(),
        "spans": [
            {"kind": s.kind.value, "start": s.start, "length": s.length,
             "image_index": s.image_index}
            for s in layout.router.spans
        ],
        "routers": {
            "smg": {"spec": family.smg_spec, "worker_expandable": family.smg_worker_expandable},
            "dynamo": {"prompt_kind": family.dynamo_prompt_kind,
                       "exact_mm_routing": family.dynamo_prompt_kind is not None},
        },
    }
    shapes = layout_shapes(layout.engine, layout.block_size)
    summary["block_keys"] = [f"{k:016x}" for k in shapes.keys(
        [content_identity(i, n) for n, i in enumerate(images)])]
    # What the keys under another naming of the images need (an engine's identifiers).
    summary["block_shapes"] = [f"{k:016x}" for k in shapes.shapes]
    summary["block_images"] = [[b, [list(x) for x in imgs]]
                               for b, imgs in enumerate(shapes.images) if imgs]
    hashes = [image_identity(i, family.name)["dynamo_mm_hash"] for i in images]
    if family.dynamo_prompt_kind is not None and all(h is not None for h in hashes):
        routing = dynamo_routing(layout, hashes)
        summary["routers"]["dynamo"].update(
            expanded_prompt_len=routing.expanded_prompt_len,
            total_tokens=len(routing.routing_ids),
            routing_blocks=len(routing.block_hashes),
            pad_values=list(routing.pad_values),
        )
    return summary


def layout_table(summary: dict[str, Any]) -> str:
    lines = [
        f"family {summary['family']}  block size {summary['block_size']}  "
        f"tokenizer {summary['tokenizer']}",
    ]
    for i, im in enumerate(summary["images"]):
        lines.append(f"  image {i}: {im['width']}x{im['height']} -> {im['tokens']} image tokens "
                     f"({im['expanded_length']} with wrappers)")
    lines.append(f"{'kind':<11}{'start':>7}{'length':>8}  image")
    for span in summary["spans"]:
        img = "" if span["image_index"] is None else str(span["image_index"])
        lines.append(f"{span['kind']:<11}{span['start']:>7}{span['length']:>8}  {img}")
    rv = summary["router_view"]
    lines.append(
        f"anchor view {summary['anchor_view']['token_count']}  router view {rv['token_count']} "
        f"({rv['full_blocks']} full blocks + {rv['partial_block_tokens']} tokens)  "
        f"worker view {summary['worker_view']['token_count']}  "
        f"engine prompt_tokens {summary['engine_prompt_tokens']}"
    )
    smg, dyn = summary["routers"]["smg"], summary["routers"]["dynamo"]
    expandable = "yes" if smg["worker_expandable"] else "no"
    dynamo = dyn["prompt_kind"] if dyn["exact_mm_routing"] else "no (text-prefix fallback)"
    lines.append(f"SMG spec {smg['spec'] or '-'} (worker-expandable: {expandable})  "
                 f"Dynamo exact MM routing: {dynamo}")
    if summary["synthetic_tokenizer"]:
        lines.append("note: text token counts come from a synthetic tokenizer (special-token "
                     "ids are real)")
    return "\n".join(lines)

