"""Plain-data and table forms of the per-router views (`mmlens layout`'s "views" key)."""

from __future__ import annotations

from typing import Any

from mmlens.layout.router_views import PartyView, RouterViews


def party_summary(view: PartyView, block_size: int) -> dict[str, Any]:
    routed = view.routed_tokens
    return {
        "semantics": view.semantics,
        "observed": view.observed,
        "outcome": view.outcome,
        "reason": view.reason,
        "rendering": view.rendering,
        "rendered_tokens": len(view.rendered_ids),
        "prompt_tokens": view.prompt_tokens,
        "routed_tokens": routed,
        "routing_blocks": None if routed is None else -(-routed // block_size),
        "images": [
            {"width": im.width, "height": im.height, "tokens": im.tokens,
             "refusal": im.refusal, "identity": im.identity, "pad_value": im.pad_value,
             "offset": im.offset}
            for im in view.images
        ],
        "config_reads": list(view.config_reads),
        "params": view.params,
        "block_hashes": list(view.block_hashes),
        "notes": list(view.notes),
    }


def views_summary(views: RouterViews, block_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {v.party.value: party_summary(v, block_size) for v in views.parties()}
    out["differences"] = [
        {"router": d.party.value, "cause": d.cause, "detail": d.detail,
         "image_index": d.image_index}
        for d in views.differences
    ]
    return out


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def views_table(summary: dict[str, Any]) -> str:
    lines = ["per-router views (engine = HF processor semantics)",
             f"{'party':<8}{'outcome':<13}{'rendered':>9}{'prompt':>8}{'routed':>8}  "
             "image tokens / identity"]
    for party in ("engine", "smg", "dynamo"):
        v = summary[party]
        images = ", ".join(
            _cell(im["tokens"]) + (f" [{im['identity'][:12]}]" if im["identity"] else "")
            for im in v["images"]) or "-"
        flag = "" if v["observed"] else " (not probed)"
        lines.append(f"{party:<8}{v['outcome']:<13}{v['rendered_tokens']:>9}"
                     f"{_cell(v['prompt_tokens']):>8}{_cell(v['routed_tokens']):>8}  "
                     f"{images}{flag}")
    for party in ("smg", "dynamo"):
        v = summary[party]
        if v["reason"]:
            lines.append(f"  {party}: {v['reason']}")
        lines += [f"  {party}: note: {n}" for n in v["notes"]]
    diffs = summary["differences"]
    lines.append("differences from the engine:" if diffs else "no router differs from the "
                 "engine on this request")
    lines += [f"  {d['router']:<7}{d['cause']}: {d['detail']}" for d in diffs]
    return "\n".join(lines)
