"""What a request is judged on, beside its own record: the realized hit the KV events show,
what each worker held of it, removals, and workers the router is blind to."""

from __future__ import annotations

from dataclasses import dataclass, field

from mmlens.ingest.observed import known
from mmlens.records import RequestTrace


# Not frozen: one is built per request judged, and a frozen one costs four times as much to
# build; nothing changes one once built.
@dataclass(slots=True)
class Realized:
    """Blocks the engine served from cache, and who said so. ``alternatives``: other block
    counts the evidence allows as well (two requests it cannot tell apart), with ``reason``."""

    blocks: int
    tokens: int | None
    source: str
    alternatives: tuple[int, ...] = ()
    reason: str | None = None


@dataclass(slots=True)
class Evidence:
    """``realized``: from KV-chain attribution (``attribution.attribute``), used when the
    record has no cached-token count; ``held``: blocks of the request each worker held when
    it was routed (earlier requests' layouts, or the availability job's KV content), with
    ``held_source`` and the earlier request it came from (``seed``); ``removed_blocks``:
    blocks the serving worker removed shortly before; ``blind``: workers whose KV events the
    router does not receive."""

    trace: RequestTrace
    realized: Realized | None = None
    held: dict[str, int] = field(default_factory=dict)
    held_source: str | None = None
    seed: str | None = None
    removed_blocks: int = 0
    blind: frozenset[str] = frozenset()


def usage_realized(t: RequestTrace, block_size: int) -> Realized | None:
    """The engine's own count (response usage, a worker span, the tap), when told."""
    if not known(t, "cached_tokens"):
        return None
    tokens = int(t.cached_tokens or 0)
    return Realized(tokens // block_size, tokens, t.provenance.get("cached_tokens", t.origin))
