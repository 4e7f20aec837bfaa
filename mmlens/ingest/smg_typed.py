"""SMG's request-span lines read from one typed decode (``SmgLine``: only the fields mmlens
reads), straight into decisions and fragments: no dict per line, no dispatch through the
whole-object readers. The whole-object path (``router_logs.decision_from``,
``observed_logs.smg_fragment``) stays as the reference: for every line this module takes,
the same decisions and fragments come out of it (``tests/core/test_smg_fast_lines.py``,
``tests/observed/test_smg_typed_store.py``); any other line goes there.

Where ``_smglines.c`` is built, a batch's lines are read by it in one compiled loop, which
calls back into this module for the rarer parts (``PATH`` says which reader serves:
"native", "typed", or "whole" to read every line whole, as the tests set it).
"""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec

from mmlens.ingest import observed, router_logs
from mmlens.ingest import observed_logs as whole
from mmlens.ingest.numbers import as_float, as_int
from mmlens.ingest.observed import SOURCE_LOG, alias, fragment, is_request_path, put
from mmlens.ingest.router_logs import (
    SMG_SELECTIONS,
    TRUNCATED,
    cache_dispatch_decision,
    score_of,
)
from mmlens.records import (
    RequestTrace,
    RoutingCandidate,
    RoutingDecision,
    RoutingScore,
    SpillGate,
)

UNSET = msgspec.UNSET


class Span(msgspec.Struct, gc=False):
    """The request span's fields an SMG line is read for (the rest is skipped undecoded);
    absent reads as None, as ``dict.get`` of the whole object would."""

    request_id: Any = None
    path: Any = None
    trace_id: Any = None
    status_code: Any = None
    latency: Any = None


class SmgLine(msgspec.Struct, gc=False):
    """Every field ``decision_from`` and ``smg_fragment`` read from an SMG line with a request
    span (its ``spans`` list, file and target, half a line, are skipped undecoded). The two
    token fields read as "this one if present, else that one" keep UNSET for absent."""

    timestamp: Any = None
    time: Any = None
    message: Any = None
    span: Span | msgspec.UnsetType = UNSET
    fields: Any = None
    evidence: Any = None
    worker: Any = None
    model_id: Any = None
    branch: Any = None
    overlap_blocks: Any = None
    request_blocks: Any = None
    matched_ratio: Any = None
    matched_units: Any = None
    input_units: Any = None
    credited_units: Any = None
    policy: Any = None
    attempt: Any = None
    status: Any = None
    original_tokens: Any = UNSET
    expanded_tokens: Any = None
    original_len: Any = None
    expanded_len: Any = None
    item_sizes: Any = None
    total_tokens: Any = None
    item_count: Any = None


class AliasLine(msgspec.Struct, gc=False):
    """SMG's ``Created AbortOnDropStream for request <engine id>`` line, read by the compiled
    reader: its outer span (``spans[0]``) names the request the engine id belongs to."""

    timestamp: Any = None
    message: Any = None
    fields: Any = None
    span: Any = UNSET
    spans: list[Span] | None = None


class Prediction(msgspec.Struct, gc=False):
    source: Any = None
    branch: Any = None
    overlap_blocks: Any = None
    request_blocks: Any = None
    block_size: Any = None
    matched_units: Any = None
    input_units: Any = None
    credited_units: Any = None


class Candidate(msgspec.Struct, gc=False):
    worker: Any = UNSET
    load: Any = None
    healthy: Any = None
    overloaded: Any = None


class Gate(msgspec.Struct, gc=False):
    worker: Any = None
    load: Any = None
    average_load: Any = None
    relative_threshold: Any = None
    absolute_threshold: Any = None
    absolute_margin: Any = None
    spill: Any = None


class Selection(msgspec.Struct, gc=False):
    worker: Any = None
    policy: Any = None
    origin: Any = None
    prediction: Prediction | None = None
    candidates: list[Candidate] | None = None
    scores: list[dict[str, Any]] | None = None  # kept whole: a score's other keys are details
    gates: list[Gate] | None = None


class CacheTrace(msgspec.Struct, gc=False):
    """What ``router_logs.cache_trace_decision`` reads from SMG's cache trace: a trace of
    another shape (a selection that is no object, say) is read whole by it instead."""

    attempt: Any = None
    dispatch_timestamp_ns: Any = None
    selections: list[Selection] | None = None
    unattributed_gates: list[Gate] | None = None
    truncated: Any = None


_decode_line = msgspec.json.Decoder(SmgLine)
_decode_alias = msgspec.json.Decoder(AliasLine)
_decode_trace = msgspec.json.Decoder(CacheTrace)
_decode = msgspec.json.Decoder()
# The SMG messages whose decision ``decision_from`` makes from ``SmgLine``'s fields alone
# (another message starting like a decision's may be read as Dynamo's: all fields then).
_DECIDED_EXACT = ("Cache routing dispatch", "pipeline attempt failed",
                  "Token expansion complete")
_DECIDED_PREFIX = (*SMG_SELECTIONS, "smg_mm_timing process_multimodal_plan")
_LABEL = f"{SOURCE_LOG}:smg"
_DECISIONS = whole.SMG_DECISIONS
_parse_ts = whole.parse_ts


def typed_line(line: str) -> SmgLine | None:
    """An SMG line with a request span, decoded; None when it needs the whole object
    (``spans`` of an engine alias, nested ``fields``, a message read as Dynamo's, no span
    or no request id in it, not a JSON object of that shape)."""
    try:
        line_ = _decode_line.decode(line)
    except (msgspec.DecodeError, RecursionError):  # and ValidationError: not of that shape
        return None
    span, msg = line_.span, line_.message
    if span is UNSET or not span.request_id or line_.fields is not None \
            or type(msg) is not str or msg.startswith("Created AbortOnDropStream"):
        return None
    if msg.startswith(_DECISIONS) and msg not in _DECIDED_EXACT and \
            not msg.startswith(_DECIDED_PREFIX):
        return None
    return line_


def read_typed(line: SmgLine, seq: int | None, into: dict[str, RequestTrace],
               decisions: list[RoutingDecision], attempts: whole.Attempts,
               errors: dict[str, int] | None) -> None:
    """What ``read_lines`` does with the whole object of this line: its decision (if it
    makes one) appended, its request's fragment in ``into`` updated."""
    span = line.span
    assert span is not UNSET  # typed_line let no other through
    msg: str = line.message
    rid = str(span.request_id)
    when = _parse_ts(line.timestamp)
    if msg.startswith(_DECISIONS):
        d = _decision(line, rid, msg, errors)
        if d is not None:
            if d.ts is None:
                d.ts = when if line.timestamp else _parse_ts(line.time)
            attempts.note(d, msg)
            decisions.append(d)
    elif msg == "finished processing request":
        attempts.done(rid)
    if not is_request_path(span.path):
        return
    t = into.get(rid)
    if t is None:
        t = fragment(rid, SOURCE_LOG, when or 0.0, "smg")
        t.trace_id = str(span.trace_id) if span.trace_id else None
    elif not whole.smg_says_something(msg):
        return
    else:
        if when and (not t.ts or when < t.ts):
            t.ts = when
        if not t.trace_id and span.trace_id:
            t.trace_id = str(span.trace_id)
    if _fields(t, line, span, msg, seq):
        into[rid] = t


def _decision(line: SmgLine, rid: str, msg: str, errors: dict[str, int] | None,
              ) -> RoutingDecision | None:
    """``decision_or_count`` of the line's whole object."""
    try:
        if msg.startswith(SMG_SELECTIONS):
            return RoutingDecision(
                rid, "smg", "log:" + msg, worker=line.worker, branch=line.branch,
                overlap_blocks=as_int(line.overlap_blocks),
                request_blocks=as_int(line.request_blocks),
                matched_ratio=as_float(line.matched_ratio),
                matched_units=as_int(line.matched_units),
                input_units=as_int(line.input_units),
                credited_units=as_int(line.credited_units), policy=line.policy)
        if msg == "Cache routing dispatch":
            evidence = line.evidence  # JSON inside a JSON string, decoded as `_parse` does
            if isinstance(evidence, str) and evidence.startswith("{"):
                trace = _typed_trace(evidence)
                if trace is not None:
                    return _trace_decision(trace, rid)
                with contextlib.suppress(msgspec.DecodeError, RecursionError):
                    evidence = _decode.decode(evidence)
            return cache_dispatch_decision(rid, evidence)
        if msg == "pipeline attempt failed":
            attempt = as_int(line.attempt)
            return RoutingDecision(rid, "smg", "log:attempt_failed", attempt=attempt, warnings=[
                f"attempt {attempt} failed: {line.status or 'error'}"])
        if msg == "Token expansion complete":
            return RoutingDecision(rid, "smg", "log:token_expansion",
                                   original_tokens=as_int(line.original_len),
                                   expanded_tokens=as_int(line.expanded_len))
        original = line.original_tokens
        return RoutingDecision(rid, "smg", "log:mm_timing",
                               original_tokens=None if original is UNSET else as_int(original),
                               expanded_tokens=as_int(line.expanded_tokens))
    except (ValueError, TypeError, ArithmeticError, RecursionError) as exc:
        if errors is not None:
            kind = f"bad_log_line:{type(exc).__name__}"
            errors[kind] = errors.get(kind, 0) + 1
        return None


def _typed_trace(evidence: str) -> CacheTrace | None:
    try:
        return _decode_trace.decode(evidence)
    except (msgspec.DecodeError, RecursionError):  # and ValidationError: read whole
        return None


def _trace_decision(trace: CacheTrace, rid: str) -> RoutingDecision:
    """``router_logs.cache_trace_decision`` of the trace's whole object."""
    d = RoutingDecision(rid, "smg", "log:cache_trace")
    d.attempt = as_int(trace.attempt)
    ts_ns = as_int(trace.dispatch_timestamp_ns)
    d.ts = ts_ns / 1e9 if ts_ns is not None and 0 < ts_ns < 1 << 63 else None
    if trace.selections:
        sel = trace.selections[0]
        d.worker, d.policy, d.origin = sel.worker, sel.policy, sel.origin
        pred = sel.prediction
        if pred is not None:
            d.prediction_source = pred.source
            d.branch = pred.branch
            d.overlap_blocks = as_int(pred.overlap_blocks)
            d.request_blocks = as_int(pred.request_blocks)
            d.block_size = as_int(pred.block_size)
            d.matched_units = as_int(pred.matched_units)
            d.input_units = as_int(pred.input_units)
            d.credited_units = as_int(pred.credited_units)
            if d.matched_units is not None and d.input_units:
                d.matched_ratio = d.matched_units / d.input_units
        if sel.candidates:
            d.candidates = [RoutingCandidate(
                "" if c.worker is UNSET else str(c.worker), as_float(c.load),
                c.healthy if type(c.healthy) is bool else None,
                c.overloaded if type(c.overloaded) is bool else None) for c in sel.candidates]
        if sel.scores:
            d.scores = [score_of(s) for s in sel.scores]
        if sel.gates:
            d.gates = [_gate(g) for g in sel.gates]
    if trace.unattributed_gates:
        d.gates += [_gate(g) for g in trace.unattributed_gates]
    if trace.truncated is True:
        d.warnings.append(TRUNCATED)
    return d


def _gate(g: Gate) -> SpillGate:
    return SpillGate(g.worker, as_float(g.load), as_float(g.average_load),
                     as_float(g.relative_threshold), as_float(g.absolute_threshold),
                     as_float(g.absolute_margin), g.spill if type(g.spill) is bool else None)


def _fields(t: RequestTrace, line: SmgLine, span: Span, msg: str, seq: int | None) -> bool:
    """``observed_logs._smg_fields`` of the line's whole object."""
    label = _LABEL
    if msg in SMG_SELECTIONS:
        put(t, "worker", line.worker, label)
        put(t, "model", line.model_id, label)
        put(t, "sent_seq", seq, label)
    elif msg == "finished processing request":
        put(t, "status", as_int(span.status_code), label)
        lat = as_float(span.latency)
        put(t, "latency_s", None if lat is None else lat / 1e6, label)
    elif msg == "Fetched images for multimodal processing":
        whole.put_image_sizes(t, line.item_sizes, label)
    elif msg == "Multimodal preprocessing complete":
        whole.put_image_tokens(t, as_int(line.total_tokens), as_int(line.item_count), label)
    elif msg.startswith("smg_mm_timing process_multimodal_plan") or msg == \
            "Token expansion complete":
        put(t, "processing_mode", "router", label)
        original = line.original_tokens
        put(t, "rendered_tokens", as_int(line.original_len if original is UNSET else original),
            label)
    elif (m := whole.COMPLETED.match(msg)) is not None:
        alias(t, m.group(1))
        put(t, "stream", False, label)
        put(t, "ended_seq", seq, label)
    elif (m := whole.MODEL_IN.search(msg)) is not None and "Processing" in msg:
        put(t, "model", m.group(1), label)
    elif msg == "Cache routing dispatch":
        put(t, "sent_seq", seq, label)
    elif msg != "started processing request":
        return False
    return True


def _shape(cls: type) -> tuple[type, tuple[tuple[str, Any, int], ...]] | None:
    """A slots dataclass as the compiled reader makes it without ``__init__``: each field's
    name, default and default factory (1 list, 2 dict); None for a class of another shape."""
    import dataclasses

    if hasattr(cls, "__post_init__") or "__slots__" not in cls.__dict__:
        return None
    out = []
    for f in dataclasses.fields(cls):
        factory = {dataclasses.MISSING: 0, list: 1, dict: 2}.get(f.default_factory)
        if factory is None:
            return None
        out.append((f.name, None if f.default is dataclasses.MISSING else f.default, factory))
    return cls, tuple(out)


def _native_reader() -> Any:
    """The compiled reader set up with this module's decoders and helpers, or None."""
    try:
        from mmlens.ingest import _smglines
    except ImportError:  # pragma: no cover - no compiler at install time
        return None
    shapes = {"decision": _shape(RoutingDecision), "candidate": _shape(RoutingCandidate),
              "score": _shape(RoutingScore), "gate": _shape(SpillGate),
              "trace": _shape(RequestTrace)}
    if None in shapes.values() or router_logs._SCORE_VALUE != {
            "policy_affinity": ("effective_score", "blocks")}:  # pragma: no cover
        return None  # not what the compiled reader builds
    try:
        _smglines.setup({
            "decode": _decode_line.decode, "decode_alias": _decode_alias.decode,
            "decode_error": msgspec.DecodeError, "unset": UNSET,
            "py_decision": _decision, "parse_ts": _parse_ts,
            "as_int": as_int, "as_float": as_float, "is_request_path": is_request_path,
            "says_something": whole.smg_says_something,
            "put_image_sizes": whole.put_image_sizes,
            "put_image_tokens": whole.put_image_tokens, "tail": _fields,
            "text_fields": observed._TEXT_FIELDS, "request_paths": observed._REQUEST_PATH_SET,
            "label": _LABEL, "source_log": SOURCE_LOG, "decode_trace": _decode_trace.decode,
            "score_known": router_logs._SCORE_KNOWN, "truncated_warning": TRUNCATED,
            # a request's first fragment is this one's copy, under its id and time
            "fragment_proto": fragment("", SOURCE_LOG, 0.0, "smg"),
            **shapes})
    except (TypeError, KeyError):  # pragma: no cover - a record of another shape
        return None
    return _smglines


NATIVE = _native_reader()
PATH = "native" if NATIVE is not None else "typed"
