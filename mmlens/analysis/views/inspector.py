"""The inspector's tables and labels for one recorded request."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mmlens.analysis.views.common import clock, worker_label
from mmlens.ingest.observed import known
from mmlens.records import RequestTrace

PREDICTION_FIELDS = ("source", "worker", "branch", "overlap_blocks", "request_blocks",
                     "block_size", "kv_hit_rate", "original_tokens", "expanded_tokens")


def request_label(t: RequestTrace, names: Mapping[str, str] | None = None) -> str:
    """How the request picker names a request: time, id, worker and outcome."""
    outcome = (f"error {t.error_code}" if t.error else
               f"cached {t.cached_tokens or 0}/{t.prompt_tokens}")
    return (f"{clock(t.ts or 0)} · {t.request_id} · {worker_label(t.worker, names)} · "
            f"{outcome}")


def cached_text(t: RequestTrace) -> int | str:
    """Cached tokens, or "unknown" for an observed request no source told them for."""
    return (t.cached_tokens or 0) if known(t, "cached_tokens") else "unknown"


def prediction_rows(t: RequestTrace) -> list[dict[str, Any]]:
    """Everything the router said, one row per decision and source."""
    return [{k: getattr(p, k) for k in PREDICTION_FIELDS} | {"warnings": "; ".join(p.warnings)}
            for p in t.predictions]


def image_rows(t: RequestTrace) -> list[dict[str, Any]]:
    return [{"image": i, "size": f"{im.width}x{im.height}", "bytes": im.byte_size,
             "url": im.url_kind, **{k: v[:16] for k, v in im.identities.items()}}
            for i, im in enumerate(t.images)]


def timing_caption(t: RequestTrace) -> str:
    ttft = "—" if t.ttft_s is None else f"{t.ttft_s:.3f} s"
    stream = "unknown" if t.stream is None else t.stream
    return (f"latency {t.latency_s or 0:.3f} s · TTFT {ttft} · stream {stream} · "
            f"model {t.model}")


def explanation_text(expl: dict[str, Any]) -> str:
    """The stored verdict's line: its headline, what was realized and, where known, the best
    any worker could have served and a failed attempt before the one that served."""
    line = f"**{expl['category']}** — {expl['headline']}"
    if expl.get("realized_tokens") is not None:
        line += f" (realized {expl['realized_tokens']} tokens"
        if expl.get("best_tokens") is not None:
            line += (f"; the best any worker could have served: {expl['best_tokens']}, on "
                     f"{expl.get('better_worker')}")
        line += ")"
    return line


def evidence_rows(evidence: Mapping[str, Any]) -> list[dict[str, str]]:
    """A verdict's evidence one field a row, nested values as compact JSON."""
    return [{"field": k, "value": v if isinstance(v, str) else
             json.dumps(v, separators=(", ", ": "), default=str)}
            for k, v in evidence.items()]
