"""The inspector's per-router panel: one row per party (engine, SMG 1.13, Dynamo 1.6.1) and
one per difference from the engine, as plain rows a page shows in a table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mmlens.layout.composition import Part
from mmlens.layout.modeldir import Model
from mmlens.layout.router_views import PartyView, RouterViews, router_views

PARTY_LABELS = {"engine": "engine (HF semantics)", "smg": "SMG 1.13", "dynamo": "Dynamo 1.6.1"}


@dataclass(frozen=True)
class RouterPanel:
    parties: list[dict[str, Any]]  # one row per party
    differences: list[dict[str, Any]]  # one row per difference: router, cause, detail
    notes: list[str]  # reasons and notes, "<party>: …"


def _short(identity: str | None) -> str:
    return "—" if identity is None else identity[:16]


def party_row(view: PartyView, block_size: int) -> dict[str, Any]:
    routed = view.routed_tokens
    return {
        "party": PARTY_LABELS[view.party.value],
        "outcome": view.outcome,
        "rendered tokens": len(view.rendered_ids),
        "prompt tokens": view.prompt_tokens,
        "routed on": routed,
        "blocks": None if routed is None else -(-routed // block_size),
        "image tokens": ", ".join("—" if i.tokens is None else str(i.tokens)
                                  for i in view.images),
        "image offsets": ", ".join(str(i.offset) for i in view.images),
        "identities": ", ".join(_short(i.identity) for i in view.images),
        "rendering": view.rendering,
        "probed": view.observed,
    }


def panel_of(views: RouterViews, block_size: int) -> RouterPanel:
    notes = [f"{v.party.value}: {text}" for v in views.parties()
             for text in ((v.reason,) if v.reason else ()) + v.notes]
    return RouterPanel(
        parties=[party_row(v, block_size) for v in views.parties()],
        differences=[{"router": PARTY_LABELS[d.party.value], "cause": d.cause,
                      "detail": d.detail} for d in views.differences],
        notes=notes,
    )


def router_panel(model: Model, parts: Sequence[Part], block_size: int = 16,
                 dynamo_backend: str = "default") -> RouterPanel:
    """What the inspector shows for one request: each party's view and the differences."""
    views = router_views(model, parts, block_size=block_size, dynamo_backend=dynamo_backend)
    return panel_of(views, block_size)
