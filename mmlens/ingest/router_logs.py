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
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from mmlens.ingest.numbers import as_float, as_int
from mmlens.records import (
    RoutingCandidate,
    RoutingDecision,
    RoutingScore,
    SpillGate,
)

_ROUTING_BEST = re.compile(
    r"\[ROUTING\]\s*Best:\s*worker_(\d+)\s+dp_rank=(\d+)\s+with\s*(\d+)/(\d+)\s*blocks overlap")
_DYN_FORMULA = re.compile(
    r"Formula for worker_id=(\d+) dp_rank=(\d+) with ([\d.]+) effective cached blocks:\s*"
    r"([\d.eE+-]+)\s*=")
_DYN_FORMULA_TERMS = re.compile(r"\b([a-z_]+):\s*([\d.eE+-]+)")
_GRPC_ENGINE_SUFFIX = re.compile(
    r"-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
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
    if not line.isascii():  # lone surrogates (stdin's surrogateescape) cannot be stored
        line = line.encode("utf-8", "replace").decode("utf-8")
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            obj = _literal(line)
        if "\\u" in line:  # a JSON escape may have made a lone surrogate
            obj = _scrub(obj)
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


MAX_LITERAL_LINE = 16_384  # a printed Python dict of a capture; ast on 1 MB takes seconds


def _literal(line: str) -> Any:
    if len(line) > MAX_LITERAL_LINE:
        raise ValueError("undecodable log line")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "invalid decimal literal" and the like
            return ast.literal_eval(line)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError("undecodable log line") from None


def _scrub(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if depth > 50:
        return None
    if isinstance(value, dict):
        return {_scrub(k, depth + 1): _scrub(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, depth + 1) for v in value]
    return value


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


_int, _float = as_int, as_float


# SMG's lines naming the worker its policy chose (one per dispatch attempt); 1.13 logs a
# request under no prefix sent to a worker still warming up as the last.
SMG_SELECTIONS = ("Cache-aware selection", "Event-driven routing",
                  "Cache miss routed to a warming worker")


def decision_from(obj: dict[str, Any]) -> RoutingDecision | None:
    msg = str(obj.get("message", ""))
    rid = _request_id(obj)
    if rid is None:
        return None
    # --- SMG ---
    if msg.startswith(SMG_SELECTIONS):
        return RoutingDecision(
            rid, "smg", "log:" + msg, worker=obj.get("worker"), branch=obj.get("branch"),
            overlap_blocks=_int(obj.get("overlap_blocks")),
            request_blocks=_int(obj.get("request_blocks")),
            matched_ratio=_float(obj.get("matched_ratio")),
            matched_units=_int(obj.get("matched_units")),
            input_units=_int(obj.get("input_units")),
            credited_units=_int(obj.get("credited_units")),
            policy=obj.get("policy"))
    if msg == "Cache routing dispatch":
        return cache_dispatch_decision(rid, obj.get("evidence"))
    if msg == "pipeline attempt failed":  # SMG retries on another worker after this
        attempt = _int(obj.get("attempt"))
        return RoutingDecision(rid, "smg", "log:attempt_failed", attempt=attempt, warnings=[
            f"attempt {attempt} failed: {obj.get('status') or 'error'}"])
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
                               overlap_blocks=_int(m.group(3)), request_blocks=_int(m.group(4)))
    m = _DYN_FORMULA.search(msg)
    if m:
        return _dynamo_cost(rid, m, msg)
    if "Selected worker" in msg:
        wid = obj.get("worker_id")
        worker = None if wid is None else str(wid)
        logit = _float(obj.get("logit"))
        scores = [] if logit is None else [RoutingScore(
            "logit", worker, logit, "cost", device_blocks=_float(
                obj.get("effective_cached_blocks")),
            details={k: obj[k] for k in ("dp_rank", "worker_type", "host_pinned_blocks",
                                         "disk_blocks", "total_kv_blocks") if k in obj})]
        return RoutingDecision(rid, "dynamo", "log:selected_worker", worker=worker,
                               policy=obj.get("router_mode"), scores=scores)
    if "image-token count" in msg:
        tokens = _int(obj.get("tokens"))
        return RoutingDecision(rid, "dynamo", "log:mm_image_tokens",
                               image_tokens=[] if tokens is None else [tokens])
    if any(marker in msg or marker in str(obj.get("error", "")) for marker in
           _DYN_FALLBACK_MARKERS):
        return RoutingDecision(rid, "dynamo", "log:mm_fallback",
                               warnings=[_with_fields(msg, obj)[:300]])
    return None


def cache_dispatch_decision(rid: str, evidence: Any) -> RoutingDecision:
    """SMG's ``Cache routing dispatch`` line: its cache trace (``evidence``, decoded or the
    JSON text) as the decision, or a bare one when it holds none."""
    if isinstance(evidence, str):
        try:
            evidence = json.loads(evidence)
        except ValueError:
            evidence = None
    if isinstance(evidence, dict):
        return cache_trace_decision(evidence, rid, "log:cache_trace")
    return RoutingDecision(rid, "smg", "log:cache_trace")


_DYN_REASON_FIELDS = ("error", "placeholder_count", "image_count", "resolved", "expected")


def _with_fields(msg: str, obj: dict[str, Any]) -> str:
    """A fallback warning plus its reason fields: JSONL lines keep them apart from the
    message (e.g. ``error="… expected 206 Partial Content, got HTTP 200 OK"``)."""
    extra = [f"{k}={obj[k]}" for k in _DYN_REASON_FIELDS
             if k in obj and str(obj[k]) not in msg]
    return f"{msg}; {', '.join(extra)}" if extra else msg


def _dynamo_cost(rid: str, m: re.Match[str], msg: str) -> RoutingDecision:
    """One candidate's cost line (``Formula for worker_id=…``): lower cost wins."""
    worker = m.group(1)
    terms = {k: _float(v) for k, v in _DYN_FORMULA_TERMS.findall(msg[m.end():])}
    score = RoutingScore("cost", worker, _float(m.group(4)), "cost",
                         device_blocks=_float(m.group(3)),
                         details={"dp_rank": _int(m.group(2)), **terms})
    return RoutingDecision(rid, "dynamo", "log:cost_formula",
                           candidates=[RoutingCandidate(worker)], scores=[score])


def _bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


def _candidate(c: dict[str, Any]) -> RoutingCandidate:
    return RoutingCandidate(str(c.get("worker", "")), _float(c.get("load")),
                            _bool(c.get("healthy")), _bool(c.get("overloaded")))


_SCORE_VALUE = {"policy_affinity": ("effective_score", "blocks")}
_SCORE_KNOWN = {"source", "worker", "score", "score_unit", "effective_score", "device_blocks",
                "request_blocks"}


def score_of(s: dict[str, Any]) -> RoutingScore:
    source = str(s.get("source", "unknown"))
    key, unit = _SCORE_VALUE.get(source, ("score", None))
    return RoutingScore(
        source, s.get("worker"), _float(s.get(key)), s.get("score_unit") or unit,
        device_blocks=_float(s.get("device_blocks")),
        request_blocks=_int(s.get("request_blocks")),
        details={k: v for k, v in s.items() if k not in _SCORE_KNOWN})


def _gate(g: dict[str, Any]) -> SpillGate:
    return SpillGate(g.get("worker"), _float(g.get("load")), _float(g.get("average_load")),
                     _float(g.get("relative_threshold")), _float(g.get("absolute_threshold")),
                     _float(g.get("absolute_margin")), _bool(g.get("spill")))


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


TRUNCATED = "cache trace truncated by SMG_CACHE_TRACE_MAX_BYTES"


def cache_trace_decision(trace: dict[str, Any], request_id: str | None = None,
                         source: str = "header:x-smg-cache-trace") -> RoutingDecision:
    """The first selection of an SMG cache trace (schema 1): the compact header gives the
    policy, origin, worker and prediction; the log's evidence adds candidates, scores and
    spill gates."""
    rid = request_id or str(trace.get("root_id", ""))
    d = RoutingDecision(rid, "smg", source)
    d.attempt = _int(trace.get("attempt"))
    ts_ns = _int(trace.get("dispatch_timestamp_ns"))
    d.ts = ts_ns / 1e9 if ts_ns is not None and 0 < ts_ns < 1 << 63 else None
    selections = _dicts(trace.get("selections"))
    if selections:
        sel = selections[0]
        d.worker, d.policy, d.origin = sel.get("worker"), sel.get("policy"), sel.get("origin")
        pred = sel.get("prediction") or {}
        if isinstance(pred, dict):
            d.prediction_source = pred.get("source")
            d.branch = pred.get("branch")
            d.overlap_blocks = _int(pred.get("overlap_blocks"))
            d.request_blocks = _int(pred.get("request_blocks"))
            d.block_size = _int(pred.get("block_size"))
            d.matched_units = _int(pred.get("matched_units"))
            d.input_units = _int(pred.get("input_units"))
            d.credited_units = _int(pred.get("credited_units"))
            if d.matched_units is not None and d.input_units:
                d.matched_ratio = d.matched_units / d.input_units
        d.candidates = [_candidate(c) for c in _dicts(sel.get("candidates"))]
        d.scores = [score_of(s) for s in _dicts(sel.get("scores"))]
        d.gates = [_gate(g) for g in _dicts(sel.get("gates"))]
    d.gates += [_gate(g) for g in _dicts(trace.get("unattributed_gates"))]
    if trace.get("truncated") is True:
        d.warnings.append(TRUNCATED)
    return d


def parsed_objects(lines: Iterable[str], errors: dict[str, int] | None = None,
                   parse: Callable[[str], dict[str, Any] | None] | None = None,
                   ) -> Iterator[dict[str, Any]]:
    """Each line that parses to an object (``parse``, default ``parse_line``); malformed lines
    are counted as ``malformed_log_line`` and skipped."""
    return (obj for _, obj in numbered_objects(enumerate(lines), errors, parse))


def numbered_objects(lines: Iterable[tuple[int, str]], errors: dict[str, int] | None = None,
                     parse: Callable[[str], dict[str, Any] | None] | None = None,
                     ) -> Iterator[tuple[int, dict[str, Any]]]:
    """``parsed_objects`` of numbered lines, each object with its line's number."""
    parse = parse or parse_line
    for n, line in lines:
        try:
            obj = parse(line)
        except ValueError:
            if errors is not None:
                errors["malformed_log_line"] = errors.get("malformed_log_line", 0) + 1
            continue
        if obj is not None:
            yield n, obj


def parse_lines(lines: Iterable[str], errors: dict[str, int] | None = None,
                ) -> list[RoutingDecision]:
    out: list[RoutingDecision] = []
    for obj in parsed_objects(lines, errors):
        d = decision_or_count(obj, errors)
        if d is not None:
            out.append(d)
    return out


def decision_or_count(obj: dict[str, Any], errors: dict[str, int] | None,
                      ) -> RoutingDecision | None:
    """``decision_from`` that never raises: a line it cannot read is counted and skipped
    (one odd line must not stop a collector that re-reads the log on every start)."""
    try:
        return decision_from(obj)
    except (ValueError, TypeError, ArithmeticError, RecursionError) as exc:
        if errors is not None:
            kind = f"bad_log_line:{type(exc).__name__}"
            errors[kind] = errors.get(kind, 0) + 1
        return None


def cache_trace_from_header(raw: str, request_id: str | None = None) -> RoutingDecision:
    """The ``x-smg-cache-trace`` header as a decision; never raises: an unreadable header
    is a decision that says so."""
    try:
        trace = json.loads(raw) if len(raw) <= 1 << 20 else None
        if isinstance(trace, dict):
            return cache_trace_decision(trace, request_id)
    except (ValueError, TypeError, ArithmeticError, RecursionError):
        pass
    return RoutingDecision(request_id or "", "smg", "header:x-smg-cache-trace",
                           warnings=["undecodable x-smg-cache-trace header"])


def _may_have_suffix(rid: str) -> bool:
    """Whether ``_GRPC_ENGINE_SUFFIX`` can match: its 37 characters start with a "-" (``$``
    also matches before a final newline). Most ids are shorter or have no dash there."""
    return (len(rid) >= 37 and rid[-37] == "-") or rid.endswith("\n")


def request_keys(request_id: str, response_id: str | None, dynamo: bool = True) -> set[str]:
    """Every id a router may have logged a trace's decisions under: the request id sent, the
    response id, SMG gRPC's response id without its engine suffix (``<rid>-<uuid>``) and
    (unless ``dynamo`` is False: a request SMG routed) Dynamo's internal id inside
    ``chatcmpl-<id>``."""
    keys = {request_id}
    if response_id:
        keys.add(response_id)
        root = _GRPC_ENGINE_SUFFIX.sub("", response_id) if _may_have_suffix(response_id) \
            else response_id
        if root not in ("chatcmpl", "cmpl"):  # Dynamo's `chatcmpl-<uuid>` is no `<rid>-<uuid>`
            keys.add(root)
        if dynamo and response_id.startswith("chatcmpl-"):
            # Dynamo: lines without `x_request_id` (e.g. "Selected worker") carry only its
            # internal request id, which the response id repeats as `chatcmpl-<id>`.
            keys.add(response_id.removeprefix("chatcmpl-"))
    keys.discard("")
    return keys
