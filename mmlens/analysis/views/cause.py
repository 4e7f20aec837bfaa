"""A request's stored verdict said in one sentence (what happened, why, and which worker held
what), and two requests side by side with what differs between them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmlens.analysis.views.common import worker_label
from mmlens.records import RequestTrace, Verdict

# Why the router did what it did, per verdict (the "because" of the sentence).
BECAUSE = {
    "hit": "as the router predicted",
    "false_hit": ("because the router keys blocks by token ids: an earlier image of the same "
                  "size had the same ids, so it looked cached (content-blind false hit)"),
    "cold": "because no worker held any of it yet",
    "spilled": "because the router balanced load (or its spill gate fired) instead",
    "events_blind": "because the router gets no KV events from it and could not see them",
    "evicted": "because the blocks were evicted between the decision and the prefill",
    "count_drift": ("because the engine expanded an image to another length than the router, "
                    "so every block after it shifted"),
    "fallback": "because the router fell back to text-prefix routing",
    "unexplained": "and mmlens sees no reason why (no removal, no spill, no drift)",
    "error": "because the request failed",
}


def _blocks(n: int | None) -> str:
    return "?" if n is None else f"{n} block{'s' if n != 1 else ''}"


def cause_sentence(v: Verdict, names: Mapping[str, str] | None = None) -> str:
    """One sentence from a stored verdict, e.g. "w1 held 10 of these blocks; the router chose
    w2, which served 0 blocks, because it balanced load instead."."""
    chosen = worker_label(v.worker, names)
    better = worker_label(v.better_worker, names) if v.better_worker else None
    got, predicted = v.realized_blocks, v.predicted_blocks
    because = BECAUSE.get(v.category, f"({v.category.replace('_', ' ')})")
    if v.category == "error":
        code = v.evidence.get("error_code") or ""
        hint = v.evidence.get("what_to_change") or ""
        return (f"The request failed{f' with {code}' if code else ''} on {chosen}: "
                f"{v.evidence.get('error') or v.headline}" + (f". {hint}" if hint else "") + ".")
    served = f"which served {_blocks(got)} from cache" if got is not None else \
        "where the realized hit is unknown"
    expect = f" expecting {_blocks(predicted)}" if predicted else ""
    if better and better != chosen and (v.better_blocks or 0) > (got or 0):
        return (f"{better} held {_blocks(v.better_blocks).replace('block', 'of these block')}; "
                f"the router chose {chosen}{expect}, {served}, {because}.")
    held = f"{chosen} held {_blocks(v.better_blocks).replace('block', 'of these block')}" \
        if better == chosen and v.better_blocks else "no worker held any of its blocks"
    if v.category == "hit":
        return (f"{chosen} served {_blocks(got)} from cache, {because}"
                f"{f' ({predicted})' if predicted is not None else ''}; {held}.")
    return f"The router chose {chosen}{expect}, {served}, {because}; {held}."


DIFF_FIELDS = ("router", "processing mode", "worker", "images", "image identity (SMG)",
               "prompt tokens", "cached tokens", "router predicted (tokens)", "verdict",
               "better worker", "TTFT (ms)")


def _facts(t: RequestTrace, v: Verdict | None, names: Mapping[str, str] | None,
           routers: Mapping[str, str] | None) -> dict[str, Any]:
    ids = [str(im.identities.get("smg_blake3") or next(iter(im.identities.values()), ""))[:12]
           for im in t.images]
    return {
        "router": (routers or {}).get(t.router, t.router),
        "processing mode": t.processing_mode or "—",
        "worker": worker_label(t.worker, names),
        "images": ", ".join(f"{im.width}x{im.height}" for im in t.images) or "none",
        "image identity (SMG)": ", ".join(i for i in ids if i) or "—",
        "prompt tokens": t.prompt_tokens,
        "cached tokens": t.cached_tokens,
        "router predicted (tokens)": None if v is None or v.predicted_blocks is None
        else v.predicted_blocks * v.block_size,
        "verdict": "pending" if v is None else v.category,
        "better worker": "—" if v is None or not v.better_worker else
        f"{worker_label(v.better_worker, names)} ({_blocks(v.better_blocks)})",
        "TTFT (ms)": None if t.ttft_s is None else round(t.ttft_s * 1000, 1),
    }


def diff_rows(a: RequestTrace, va: Verdict | None, b: RequestTrace, vb: Verdict | None,
              names: Mapping[str, str] | None = None,
              routers: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per fact of the two requests, and whether it differs (TTFT always does)."""
    fa, fb = _facts(a, va, names, routers), _facts(b, vb, names, routers)
    return [{"": k, a.request_id: _cell(fa[k]), b.request_id: _cell(fb[k]),
             "differs": "" if fa[k] == fb[k] or k == "TTFT (ms)" else "◆"}
            for k in DIFF_FIELDS]


def _cell(v: Any) -> str:
    return "—" if v is None else str(v)


def default_partner(t: RequestTrace, others: list[RequestTrace]) -> RequestTrace | None:
    """What to compare a request with: the nearest other request with the same images (A vs
    A again, or one request through router and worker mode), else the one just before it."""
    def key(x: RequestTrace) -> tuple[str, ...]:
        return tuple(sorted(str(v) for im in x.images for v in im.identities.values()))

    mine = key(t)
    rest = [o for o in others if o.request_id != t.request_id]
    same = [o for o in rest if mine and key(o) == mine]
    pool = same or [o for o in rest if (o.ts or 0) <= (t.ts or 0)] or rest
    return min(pool, key=lambda o: abs((o.ts or 0) - (t.ts or 0)), default=None)
