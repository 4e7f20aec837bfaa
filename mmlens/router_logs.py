"""Router log lines (SMG JSON logs, Dynamo JSONL or text logs) → RoutingDecision records.

SMG (``--log-json``): routing lines carry no request id of their own; the request span does
(``span.request_id``). Dynamo: ``request_id`` / ``x_request_id`` fields in JSONL, or
``request_id=…`` in text lines. Lines that mean nothing for routing are ignored; lines that
cannot be parsed are counted by the caller.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from typing import Any

from mmlens.records import RequestTrace, RoutingDecision

_ROUTING_BEST = re.compile(
    r"\[ROUTING\]\s*Best:\s*worker_(\d+)\s+dp_rank=(\d+)\s+with\s*(\d+)/(\d+)\s*blocks overlap")
_KV = re.compile(r'\b([a-z_]+)=("(?:[^"\\]|\\.)*"|[^\s,]+)')
_DYN_FALLBACK_MARKERS = (
    "skipping MM routing info", "MM routing entry skipped", "skipping mm_hashes forwarding",
    "not supported for MM-aware KV routing", "expected 206 Partial Content",
    "cardinality mismatch",
)


def parse_line(line: str) -> dict[str, Any] | None:
    """A JSON object line (or a Python-literal dict, as some captures print), else a text
    line as ``{"message": line}`` plus its ``key=value`` fields; None for blank lines."""
    line = line.strip()
    if not line:
        return None
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except ValueError:
            try:
                obj = ast.literal_eval(line)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                raise ValueError("undecodable log line") from None
        if not isinstance(obj, dict):
            raise ValueError("log line is not an object")
        fields = obj.get("fields")
        if isinstance(fields, dict):  # tracing-subscriber JSON layout nests fields
            obj = {**obj, **fields}
        return obj
    out: dict[str, Any] = {"message": line}
    for key, value in _KV.findall(line):
        out.setdefault(key, value.strip('"'))
    return out


def _request_id(obj: dict[str, Any]) -> str | None:
    span = obj.get("span")
    if isinstance(span, dict) and span.get("request_id"):
        return str(span["request_id"])
    for spans_key in ("spans",):
        spans = obj.get(spans_key)
        if isinstance(spans, list):
            for sp in spans:
                if isinstance(sp, dict) and sp.get("request_id"):
                    return str(sp["request_id"])
    for key in ("x_request_id", "request_id", "root_id"):
        if obj.get(key):
            return str(obj[key])
    return None


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def decision_from(obj: dict[str, Any]) -> RoutingDecision | None:
    msg = str(obj.get("message", ""))
    rid = _request_id(obj)
    if rid is None:
        return None
    # --- SMG ---
    if msg == "Cache-aware selection" or msg.startswith("Event-driven routing"):
        return RoutingDecision(
            rid, "smg", "log:" + msg, worker=obj.get("worker"), branch=obj.get("branch"),
            overlap_blocks=_int(obj.get("overlap_blocks")),
            request_blocks=_int(obj.get("request_blocks")),
            matched_ratio=_float(obj.get("matched_ratio")))
    if msg == "Cache routing dispatch":
        d = RoutingDecision(rid, "smg", "log:cache_trace")
        evidence = obj.get("evidence")
        if isinstance(evidence, str):
            try:
                evidence = json.loads(evidence)
            except ValueError:
                evidence = None
        if isinstance(evidence, dict):
            return cache_trace_decision(evidence, rid, "log:cache_trace")
        return d
    if msg.startswith("smg_mm_timing process_multimodal_plan"):
        return RoutingDecision(rid, "smg", "log:mm_timing",
                               original_tokens=_int(obj.get("original_tokens")),
                               expanded_tokens=_int(obj.get("expanded_tokens")))
    if msg == "Token expansion complete":
        return RoutingDecision(rid, "smg", "log:token_expansion",
                               original_tokens=_int(obj.get("original_len")),
                               expanded_tokens=_int(obj.get("expanded_len")))
    # --- Dynamo ---
    m = _ROUTING_BEST.search(msg)
    if m:
        return RoutingDecision(rid, "dynamo", "log:routing_best", worker=m.group(1),
                               overlap_blocks=int(m.group(3)), request_blocks=int(m.group(4)))
    if "Selected worker" in msg:
        wid = obj.get("worker_id")
        return RoutingDecision(rid, "dynamo", "log:selected_worker",
                               worker=None if wid is None else str(wid))
    if "image-token count" in msg:
        tokens = _int(obj.get("tokens"))
        return RoutingDecision(rid, "dynamo", "log:mm_image_tokens",
                               image_tokens=[] if tokens is None else [tokens])
    if any(marker in msg or marker in str(obj.get("error", "")) for marker in
           _DYN_FALLBACK_MARKERS):
        return RoutingDecision(rid, "dynamo", "log:mm_fallback",
                               warnings=[_with_fields(msg, obj)[:300]])
    return None


_DYN_REASON_FIELDS = ("error", "placeholder_count", "image_count", "resolved", "expected")


def _with_fields(msg: str, obj: dict[str, Any]) -> str:
    """A fallback warning plus its reason fields: JSONL lines keep them apart from the
    message (e.g. ``error="… expected 206 Partial Content, got HTTP 200 OK"``)."""
    extra = [f"{k}={obj[k]}" for k in _DYN_REASON_FIELDS
             if k in obj and str(obj[k]) not in msg]
    return f"{msg}; {', '.join(extra)}" if extra else msg


def cache_trace_decision(trace: dict[str, Any], request_id: str | None = None,
                         source: str = "header:x-smg-cache-trace") -> RoutingDecision:
    """The first selection of an SMG cache trace (header or log evidence, schema 1)."""
    rid = request_id or str(trace.get("root_id", ""))
    d = RoutingDecision(rid, "smg", source)
    selections = trace.get("selections") or []
    if selections and isinstance(selections[0], dict):
        sel = selections[0]
        d.worker = sel.get("worker")
        pred = sel.get("prediction") or {}
        if isinstance(pred, dict):
            d.branch = pred.get("branch")
            d.overlap_blocks = _int(pred.get("overlap_blocks"))
            d.request_blocks = _int(pred.get("request_blocks"))
            d.block_size = _int(pred.get("block_size"))
    return d


def parse_lines(lines: Iterable[str], errors: dict[str, int] | None = None,
                ) -> list[RoutingDecision]:
    out: list[RoutingDecision] = []
    for line in lines:
        try:
            obj = parse_line(line)
        except ValueError:
            if errors is not None:
                errors["malformed_log_line"] = errors.get("malformed_log_line", 0) + 1
            continue
        if obj is None:
            continue
        d = decision_from(obj)
        if d is not None:
            out.append(d)
    return out


def join(traces: Iterable[RequestTrace], decisions: Iterable[RoutingDecision]) -> int:
    """Attach decisions to traces by request id (also matching SMG's gRPC response ids,
    ``chatcmpl-<rid>-<uuid>``, and Dynamo's internal id inside ``chatcmpl-<id>``). Returns the
    number attached."""
    by_id: dict[str, list[RoutingDecision]] = {}
    for d in decisions:
        by_id.setdefault(d.request_id, []).append(d)
    attached = 0
    for t in traces:
        keys = {t.request_id, t.response_id or ""}
        if t.response_id and t.response_id.startswith("chatcmpl-"):
            # Dynamo: lines without `x_request_id` (e.g. "Selected worker") carry only its
            # internal request id, which the response id repeats as `chatcmpl-<id>`.
            keys.add(t.response_id.removeprefix("chatcmpl-"))
        for key in keys:
            for d in by_id.get(key, []):
                if d not in t.predictions:
                    t.predictions.append(d)
                    attached += 1
                    if d.expanded_tokens is not None and t.processing_mode is None:
                        # SMG logs the expansion only when the router expanded the images.
                        t.processing_mode = "router"
    return attached
