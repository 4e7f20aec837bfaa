"""Routing decisions joined to stored traces by request key at read time — the one join.

Decisions come from the trace itself (``x-smg-cache-trace`` header, Dynamo's ``nvext``) and
from router logs, which the collector stores on their own; any trace — Lab, warm-up,
``mmlens check``, ``mmlens collect`` — meets its logged decisions here.
"""

from __future__ import annotations

from collections.abc import Iterable

from mmlens.ingest.observed import keys_of
from mmlens.records import RequestTrace, RoutingDecision


def trace_keys(trace: RequestTrace) -> set[str]:
    """Every id a router may have logged the request under (request, response and engine
    ids, aliases an observed request gathered)."""
    return keys_of(trace)


def attach(traces: Iterable[RequestTrace], decisions: Iterable[RoutingDecision]) -> int:
    """Add each logged decision to the traces it belongs to (as a prediction), unless the
    trace already holds it (rows written before decisions were joined only here carry
    them). Marks router-mode processing where the router logged an expansion. Returns how
    many were added."""
    by_key: dict[str, list[RoutingDecision]] = {}
    for d in decisions:
        by_key.setdefault(d.request_id, []).append(d)
    added = 0
    for t in traces:
        for key in sorted(trace_keys(t)):
            for d in by_key.get(key, []):
                if d in t.predictions:
                    continue
                t.predictions.append(d)
                added += 1
                if d.expanded_tokens is not None and t.processing_mode is None:
                    t.processing_mode = "router"  # SMG logs it only for router-side expansion
    return added
