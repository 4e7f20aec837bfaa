"""Which workers' engines announce every KV block they compute, from the targets the
collectors were given and the workers the routers list.

vLLM caches a prompt's full blocks when its scheduler allocates them and keeps a block
computed again beside the one already cached (its block pool does not de-duplicate), each
one announced: the blocks a request computed are its own stored segment. SGLang's radix
tree inserts a prompt after its prefill and keeps one copy of a prefix: a request that
computed blocks another request inserted first announces nothing of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ANNOUNCES_ALL = frozenset({"vllm"})


def announcing_units(targets: Mapping[str, Any] | None,
                     router_state: Any = None) -> frozenset[str]:
    """The names (router URLs and names) of the workers whose engine is vLLM: as configured,
    else as a router lists its runtime."""
    out: set[str] = set()
    told: set[str] = set()
    for w in (targets or {}).get("workers") or ():
        names = {n for n in (w.get("router_url"), w.get("name")) if n}
        told |= names
        if w.get("engine") in ANNOUNCES_ALL:
            out |= names
    for router in router_state or ():
        for w in router.get("workers") or () if isinstance(router, dict) else ():
            url = w.get("url")
            if url and url not in told and w.get("runtime") in ANNOUNCES_ALL:
                out.add(url)
    return frozenset(out)


def announces_all(units: frozenset[str], unit: str) -> bool:
    """Whether ``unit`` (a worker, or ``worker#rank``) is one of ``units``."""
    return unit.split("#", 1)[0] in units
