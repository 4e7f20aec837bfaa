"""The Lab page's choices: configured routers, the models a router lists, synthetic tints."""

from __future__ import annotations

from typing import Any


def routers(targets: dict[str, Any] | None) -> list[dict[str, Any]]:
    return list((targets or {}).get("routers") or [])


def models_of(states: list[dict[str, Any]] | None, router_name: str) -> list[str]:
    for s in states or []:
        if s.get("router") == router_name:
            return list(s.get("models") or [])
    return []


def tint(seed: int) -> tuple[int, int, int]:
    """A colour per seed, so images of different seeds differ in content."""
    return (seed * 37) % 256, (seed * 91 + 60) % 256, (seed * 53 + 120) % 256
