"""Miss verdicts for any request, whatever told us about it (mmlens' own senders, router logs,
OTLP spans, the tap).

Without an expected layout (requests mmlens did not send carry none unless the tap computed
one), a request is judged on what the router predicted (overlap blocks on the chosen worker,
spill gates, fallback warnings, its own image-token counts) against what the engine realized
(``cached_tokens`` from the response, a worker's span, or the blocks the serving worker newly
stored while serving it, from its KV events). First match wins:

error → fallback → count_drift → (realized known) false_hit | evicted | hit | spilled | cold →
(realized unknown) spilled | cold | unknown.

Every verdict lists where each input came from and which inputs were unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mmlens.ingest.observed import SOURCE_KV, known
from mmlens.records import RequestTrace, RoutingDecision

Verdict = Literal["hit", "cold", "false_hit", "spilled", "count_drift", "fallback",
                  "evicted", "unknown", "error"]
VERDICTS: tuple[str, ...] = ("hit", "cold", "false_hit", "spilled", "count_drift", "fallback",
                             "evicted", "unknown", "error")
FALLBACK_MARKERS = ("fallback", "text-prefix", "text-only", "skipping mm routing",
                    "mm routing entry skipped", "not supported for mm-aware",
                    "expected 206", "cardinality mismatch")
MISS_BRANCHES = ("event_miss", "expected_wait_fallback", "min_load_fallback",
                 "first_healthy_fallback", "no_tree_random")


@dataclass(frozen=True, slots=True)
class Realized:
    """Blocks the engine served from cache, and who said so."""

    blocks: int
    tokens: int | None
    source: str


@dataclass(frozen=True, slots=True)
class StoredWhileServed:
    """What the serving worker's KV events showed while it served the request."""

    blocks: int  # blocks newly stored
    from_root: bool  # the first of them starts a chain (no parent): nothing was reused


@dataclass
class Judgement:
    request_id: str
    category: Verdict
    headline: str
    evidence: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "category": self.category,
                "headline": self.headline, "evidence": self.evidence,
                "sources": self.sources, "unknown": self.unknown}


def _first(preds: Sequence[RoutingDecision], name: str) -> Any:
    ordered = sorted(preds, key=lambda p: p.overlap_blocks is None)
    return next((getattr(p, name) for p in ordered if getattr(p, name) is not None), None)


def _prediction(t: RequestTrace) -> dict[str, Any]:
    p = t.predictions
    return {"predicted_blocks": _first(p, "overlap_blocks"),
            "request_blocks": _first(p, "request_blocks"),
            "block_size": _first(p, "block_size") or 16,
            "branch": _first(p, "branch"), "predicted_worker": _first(p, "worker"),
            "expanded_tokens": _first(p, "expanded_tokens"),
            "spill": any(g.spill for p_ in p for g in p_.gates if g.worker in (None, t.worker))
            or _first(p, "branch") == "spill",
            "warnings": [w for p_ in p for w in p_.warnings],
            "sources": sorted({p_.source for p_ in p})}


def realized_of(t: RequestTrace, block_size: int, request_blocks: int | None,
                stored: StoredWhileServed | None) -> Realized | None:
    """Cached blocks the engine reported; else what the serving worker's KV events say: a
    chain stored from the root means nothing was cached, otherwise the request's full blocks
    less those it stored (Dynamo counts a last partial block, engines cache full ones)."""
    if known(t, "cached_tokens"):
        src = t.provenance.get("cached_tokens", t.origin)
        return Realized(int(t.cached_tokens or 0) // block_size, t.cached_tokens, src)
    if stored is None:
        return None
    if stored.from_root or request_blocks == 0:
        return Realized(0, None, SOURCE_KV)
    if request_blocks is None:
        return None
    full = request_blocks - (1 if t.router_kind == "dynamo" else 0)
    return Realized(max(full - stored.blocks, 1 if stored.blocks else 0), None, SOURCE_KV)


def _router_prompt(t: RequestTrace, pred: dict[str, Any]) -> int | None:
    """The prompt length the router expected the engine to see (after image expansion)."""
    if pred["expanded_tokens"] is not None:
        return int(pred["expanded_tokens"])
    tokens = [im.tokens for im in t.images]
    if t.router_kind == "dynamo" and t.rendered_tokens is not None and tokens and \
            all(n is not None for n in tokens):
        return t.rendered_tokens - len(tokens) + sum(n for n in tokens if n is not None)
    return None


def _sources(t: RequestTrace, pred: dict[str, Any]) -> dict[str, str]:
    out = dict(t.provenance) if t.origin == "observed" else {"*": t.origin}
    if pred["sources"]:
        out["prediction"] = ", ".join(pred["sources"])
    return out


def judge(t: RequestTrace, *, stored: StoredWhileServed | None = None,
          removed_blocks: int = 0) -> Judgement:
    """``stored``: what the serving worker stored while serving ``t`` (None: not known, e.g.
    no KV events or another request on that worker at the same time); ``removed_blocks``:
    blocks it evicted in the minutes before."""
    pred = _prediction(t)
    bs = int(pred["block_size"])
    ev: dict[str, Any] = {k: pred[k] for k in ("predicted_blocks", "request_blocks", "branch",
                                                "predicted_worker")}
    ev.update(worker=t.worker, cached_tokens=t.cached_tokens if known(t, "cached_tokens")
              else None, prompt_tokens=t.prompt_tokens, router_notes=pred["warnings"])
    unknown = [f for f in ("worker", "cached_tokens", "prompt_tokens", "status")
               if not known(t, f)]
    if pred["predicted_blocks"] is None:
        unknown.append("predicted_blocks")
    j = Judgement(t.request_id, "unknown", "", ev, _sources(t, pred), unknown)
    realized = realized_of(t, bs, pred["request_blocks"], stored)
    if realized is not None:
        ev.update(realized_blocks=realized.blocks, realized_source=realized.source)
        j.sources["realized"] = realized.source
        if "cached_tokens" in j.unknown and realized.source == SOURCE_KV:
            j.unknown.remove("cached_tokens")
    return _classify(j, t, pred, realized, bs, removed_blocks)


def _classify(j: Judgement, t: RequestTrace, pred: dict[str, Any], realized: Realized | None,
              bs: int, removed_blocks: int) -> Judgement:
    predicted, worker = pred["predicted_blocks"], t.worker or pred["predicted_worker"]
    if t.error or (t.status or 200) >= 400:
        return _set(j, "error", f"the request failed: {t.error_code or t.status}")
    notes = " ".join(pred["warnings"]).lower()
    if any(m in notes for m in FALLBACK_MARKERS):
        return _set(j, "fallback", "the router fell back to text-prefix routing: "
                    + "; ".join(pred["warnings"][:3]))
    expected = _router_prompt(t, pred)
    if expected is not None and known(t, "prompt_tokens") and t.prompt_tokens is not None \
            and t.prompt_tokens != expected:
        j.evidence.update(expected_prompt_tokens=expected,
                          difference=t.prompt_tokens - expected)
        return _set(j, "count_drift", (
            f"count drift: the engine expanded to {t.prompt_tokens} tokens, the router's view "
            f"has {expected} ({t.prompt_tokens - expected:+d}); blocks after the first image "
            "cannot match"))
    if realized is not None:
        return _with_realized(j, predicted, realized, worker, removed_blocks, pred)
    if pred["spill"]:
        return _set(j, "spilled", f"spilled: the router's spill gate sent it to {worker}")
    if predicted == 0 or (predicted is None and pred["branch"] in MISS_BRANCHES):
        return _set(j, "cold", (f"cold (as the router saw it): no worker held a prefix of it "
                                f"({pred['branch'] or '0 blocks overlap'}); realized hit "
                                "unknown"))
    if predicted is None:
        return _set(j, "unknown", "unknown: no routing decision and no realized hit were seen "
                    "for this request")
    return _set(j, "unknown", (
        f"unknown: the router predicted {predicted} cached blocks on {worker}; the realized "
        "hit is unknown (no response through the tap, no worker span, no KV events of it)"))


def _with_realized(j: Judgement, predicted: int | None, realized: Realized,
                   worker: str | None, removed_blocks: int, pred: dict[str, Any]) -> Judgement:
    got = realized.blocks
    if predicted is not None and predicted > got + 1:
        if removed_blocks >= predicted - got:
            j.evidence["removed_blocks_before"] = removed_blocks
            return _set(j, "evicted", (
                f"evicted: the router predicted {predicted} blocks on {worker}, the engine "
                f"found {got}; {worker} removed {removed_blocks} blocks shortly before"))
        return _set(j, "false_hit", (
            f"content-blind false hit: the router predicted {predicted} blocks on {worker}, "
            f"the engine found {got} ({realized.source}); same token ids, other content "
            "(e.g. another image of the same size)"))
    if got > 0:
        return _set(j, "hit", f"hit: {got} blocks served from cache on {worker} "
                              f"(router predicted {predicted if predicted is not None else '?'})")
    if pred["spill"]:
        return _set(j, "spilled", f"spilled: the router's spill gate sent it to {worker}, "
                                  "which held nothing of it")
    return _set(j, "cold", f"cold: nothing of it was cached on {worker} "
                           f"({realized.source}), and the router expected nothing")


def _set(j: Judgement, category: Verdict, headline: str) -> Judgement:
    j.category, j.headline = category, headline
    return j


def counts(judgements: Sequence[Judgement]) -> dict[str, int]:
    out = dict.fromkeys(VERDICTS, 0)
    for j in judgements:
        out[j.category] += 1
    return out


def as_trace(t: RequestTrace | dict[str, Any]) -> RequestTrace:
    """A record from a stored trace body (dict) or the record itself."""
    if isinstance(t, RequestTrace):
        return t
    import msgspec

    return msgspec.convert(t, RequestTrace, strict=False)


def judge_all(traces: Sequence[RequestTrace | dict[str, Any]]) -> list[Judgement]:
    """Every request judged on what the store holds of it (no KV-event realization)."""
    return [judge(as_trace(t)) for t in traces]


def summary(traces: Sequence[RequestTrace | dict[str, Any]]) -> dict[str, Any]:
    """Requests by origin and source, and verdicts over all of them (for the snapshot)."""
    records = [as_trace(t) for t in traces]
    by_origin: dict[str, int] = {}
    by_source: dict[str, int] = {}
    for t in records:
        by_origin[t.origin] = by_origin.get(t.origin, 0) + 1
        for s in t.sources or [t.origin]:
            by_source[s] = by_source.get(s, 0) + 1
    return {"requests": len(records), "by_origin": by_origin, "by_source": by_source,
            "verdicts": counts([judge(t) for t in records])}


FIELDS = ("worker", "model", "status", "prompt_tokens", "cached_tokens", "completion_tokens",
          "latency_s", "ttft_s", "processing_mode", "rendered_tokens", "images")


def field_rows(t: RequestTrace | dict[str, Any]) -> list[dict[str, Any]]:
    """Each field of a request with its value and the source that told it, or "unknown"."""
    rec = as_trace(t)
    rows = []
    for name in FIELDS:
        value: Any = getattr(rec, name)
        if name == "images":
            value = len(value) if value else None
        if known(rec, name) and (name != "images" or value is not None):
            source = rec.provenance.get(name, rec.origin)
            rows.append({"field": name, "value": value, "source": source})
        else:
            rows.append({"field": name, "value": None, "source": "unknown"})
    return rows
