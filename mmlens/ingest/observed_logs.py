"""Router log lines → observed-request fragments (see ``mmlens.ingest.observed``).

SMG (``--log-json``): every line of a request carries the request span
(``span.request_id``, ``span.path``, ``span.trace_id`` with ``--enable-trace``); the lines
that matter name the worker and model (``Event-driven routing``, ``Cache-aware selection``),
the images (``Fetched images for multimodal processing``: sizes; ``Multimodal preprocessing
complete``: tokens), the engine id (``Request <id> marked as completed``) and the outcome
(``finished processing request``: status, latency in µs). Dynamo (``DYN_LOGGING_JSONL``):
lines carry ``request_id`` (internal), ``x_request_id`` (the client's) and ``trace_id``;
``request received``, ``image-token count`` (one line per image), ``Selected worker``,
``http response sent`` (status, latency, TTFT, worker). The same field names arrive as OTLP
span attributes and span events, so spans reuse these mappings.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import msgspec

try:  # the noise filter compiled (``_lines.c``, built at install time when it can be)
    from mmlens.ingest import _lines as _native
except ImportError:  # pragma: no cover - no compiler at install time
    _native = None
from mmlens.ingest.numbers import as_float, as_int
from mmlens.ingest.observed import (
    SOURCE_LOG,
    alias,
    coalesce,
    fragment,
    is_request_path,
    put,
)
from mmlens.ingest.router_logs import (
    SMG_SELECTIONS,
    decision_or_count,
    parse_line,
)
from mmlens.records import ImageInfo, RequestTrace, RoutingDecision

IMAGE_SIZE = re.compile(r"width:\s*(\d+),\s*height:\s*(\d+)")
COMPLETED = re.compile(r"^Request (\S+) marked as completed")
_STREAM_FOR = re.compile(r"^Created AbortOnDropStream for request (\S+)")
MODEL_IN = re.compile(r"request for model: ([^,\s]+)")
_ROUTING_BEST = re.compile(r"\[ROUTING\]\s*Best:\s*worker_(\d+)")




def parse_ts(v: Any) -> float | None:
    """SMG ``2026-12-01 02:56:07`` (UTC) or Dynamo ISO ``2026-11-30T05:25:31.896768Z``."""
    if not isinstance(v, str) or len(v) < 19:
        return None
    return _parse_ts(v)


@functools.lru_cache(maxsize=4096)  # SMG stamps whole seconds: most lines repeat one
def _parse_ts(v: str) -> float | None:
    try:
        dt = datetime.fromisoformat(v.replace("Z", "+00:00").replace(" ", "T", 1))
    except ValueError:
        return None
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def smg_fragment(obj: dict[str, Any], source: str = SOURCE_LOG, ts: float | None = None,
                 into: dict[str, RequestTrace] | None = None, seq: int | None = None,
                 ) -> RequestTrace | None:
    """One SMG line's fragment, or None when the line says nothing about a served request.
    With ``into`` (request id → fragment), a later line of a request already there is
    written into its fragment (later lines win, as ``coalesce`` would fold them). ``seq``:
    the line's number in its log (a dispatch and a completion line keep theirs)."""
    span = obj.get("span")
    if not isinstance(span, dict) or not span.get("request_id"):
        return None
    if not is_request_path(span.get("path")):
        return None
    msg = str(obj.get("message", ""))
    rid = str(span["request_id"])
    when = ts if ts is not None else parse_ts(obj.get("timestamp"))
    t = None if into is None else into.get(rid)
    if t is None:
        t = fragment(rid, source, when or 0.0, "smg")
        t.trace_id = str(span["trace_id"]) if span.get("trace_id") else None
    elif not smg_says_something(msg):
        return None
    else:
        if when and (not t.ts or when < t.ts):
            t.ts = when
        if not t.trace_id and span.get("trace_id"):
            t.trace_id = str(span["trace_id"])
    if not _smg_fields(t, obj, span, msg, f"{source}:smg", seq):
        return None
    if into is not None:
        into[rid] = t
    return t


_SMG_SAYS = (*SMG_SELECTIONS, "finished processing request",
             "Fetched images for multimodal processing", "Multimodal preprocessing complete",
             "Token expansion complete", "Cache routing dispatch", "started processing request")


# SMG 1.13 when a worker dies under a stream it already answered 200 for: no retry, the
# client gets an error event. The line has no span; its request id is the engine's.
_SMG_STREAM_ENDED = "Stream ended by the engine before completion"


def smg_stream_failure(obj: dict[str, Any]) -> RequestTrace:
    t = fragment(str(obj.get("request_id", "")), SOURCE_LOG,
                 parse_ts(obj.get("timestamp")) or 0.0, "smg")
    label = f"{SOURCE_LOG}:smg"
    put(t, "error", str(obj.get("message", ""))[:300], label)
    put(t, "error_code", obj.get("error_type"), label)
    put(t, "worker", obj.get("worker"), label)
    return t


def smg_stream_end(engine_id: str, obj: dict[str, Any], seq: int | None = None,
                   ) -> RequestTrace:
    """SMG's completion line of a streamed body (no request span: the handler had returned,
    and its "finished processing request" latency is the time to the response's head). The
    engine id joins it to the request (``Created AbortOnDropStream``); the line's second
    bounds when the stream ended."""
    when = parse_ts(obj.get("timestamp"))
    t = fragment(engine_id, SOURCE_LOG, when or 0.0, "smg")
    label = f"{SOURCE_LOG}:smg"
    put(t, "stream", True, label)
    put(t, "ended_by", None if when is None else when + 1.0, label)
    put(t, "ended_seq", seq, label)
    return t


def _engine_alias(obj: dict[str, Any], into: dict[str, RequestTrace]) -> None:
    """``Created AbortOnDropStream for request <engine id>``: its spans name the request
    (the outer one) and the engine id it was dispatched under."""
    spans = obj.get("spans")
    outer = spans[0] if isinstance(spans, list) and spans else None
    m = _STREAM_FOR.match(str(obj.get("message", "")))
    if not isinstance(outer, dict) or m is None or not outer.get("request_id") \
            or not is_request_path(outer.get("path")):
        return
    rid = str(outer["request_id"])
    t = into.get(rid)
    if t is None:
        t = into[rid] = fragment(rid, SOURCE_LOG, parse_ts(obj.get("timestamp")) or 0.0, "smg")
        t.trace_id = str(outer["trace_id"]) if outer.get("trace_id") else None
    alias(t, m.group(1))


def smg_says_something(msg: str) -> bool:
    return (msg in _SMG_SAYS or msg.startswith(("smg_mm_timing process_multimodal_plan",
                                                "Request "))
            or ("Processing" in msg and MODEL_IN.search(msg) is not None))


def _smg_fields(t: RequestTrace, obj: dict[str, Any], span: dict[str, Any], msg: str,
                label: str, seq: int | None = None) -> bool:
    """What one SMG line says, set on ``t``; False when it says nothing."""
    if msg in SMG_SELECTIONS:
        put(t, "worker", obj.get("worker"), label)
        put(t, "model", obj.get("model_id"), label)
        put(t, "sent_seq", seq, label)  # a retry's selection comes later: the serving one
    elif msg == "finished processing request":
        put(t, "status", as_int(span.get("status_code")), label)
        lat = as_float(span.get("latency"))
        put(t, "latency_s", None if lat is None else lat / 1e6, label)
    elif msg == "Fetched images for multimodal processing":
        put_image_sizes(t, obj.get("item_sizes", ""), label)
    elif msg == "Multimodal preprocessing complete":
        put_image_tokens(t, as_int(obj.get("total_tokens")), as_int(obj.get("item_count")),
                         label)
    elif msg.startswith("smg_mm_timing process_multimodal_plan") or msg == \
            "Token expansion complete":
        put(t, "processing_mode", "router", label)
        put(t, "rendered_tokens", as_int(obj.get("original_tokens", obj.get("original_len"))),
            label)
    elif (m := COMPLETED.match(msg)) is not None:
        alias(t, m.group(1))
        # Inside the request's span: the body was whole when the handler returned (a
        # stream's ends on a line without it, after the handler's "finished" line).
        put(t, "stream", False, label)
        put(t, "ended_seq", seq, label)
    elif (m := MODEL_IN.search(msg)) is not None and "Processing" in msg:
        put(t, "model", m.group(1), label)
    elif msg == "Cache routing dispatch":  # its decision is `router_logs`'
        put(t, "sent_seq", seq, label)
    elif msg != "started processing request":
        return False  # the request exists, the line says nothing more
    return True


def put_image_sizes(t: RequestTrace, item_sizes: Any, label: str) -> None:
    """SMG's ``Fetched images for multimodal processing``: each image's pixel size."""
    sizes = IMAGE_SIZE.findall(str(item_sizes or ""))
    if sizes:
        t.images = [ImageInfo("data", width=int(w), height=int(h)) for w, h in sizes]
        t.provenance["images"] = label


def put_image_tokens(t: RequestTrace, tokens: int | None, items: int | None,
                     label: str) -> None:
    """SMG's ``Multimodal preprocessing complete``: the one image's token count."""
    if tokens is not None and items == 1:
        if len(t.images) == 1:  # the "Fetched images" line before it gave the size
            t.images[0].tokens = tokens
        else:
            t.images = [ImageInfo("data", tokens=tokens)]
        t.provenance["images"] = label


def dynamo_fragment(obj: dict[str, Any], source: str = SOURCE_LOG,
                    ts: float | None = None) -> RequestTrace | None:
    rid = obj.get("request_id")
    if not rid:
        return None
    if "uri" in obj and not is_request_path(obj.get("uri")):
        return None
    msg = str(obj.get("message", ""))
    when = ts if ts is not None else parse_ts(obj.get("time"))
    worker = obj.get("instance_id") if obj.get("span_name") == "handle_payload" else None
    if worker is not None and (msg != "request received" or obj.get("endpoint") != "generate"
                               or when is None):
        return None  # a worker's other ingress lines (its KV queries, its completions)
    t = fragment(str(rid), source, when or 0.0, "dynamo")
    label = f"{source}:dynamo"
    alias(t, obj.get("x_request_id"))
    t.trace_id = str(obj["trace_id"]) if obj.get("trace_id") else None
    if worker is not None:  # a worker's own log: when the request reached it, on its clock
        t.engine_received[str(worker)] = t.ts
        t.provenance["engine_received"] = f"{source}:dynamo_worker"
    elif msg == "request received":
        put(t, "model", obj.get("model"), label)
        put(t, "stream", {"stream": True, "unary": False}.get(str(obj.get("request_type"))),
            label)
    elif msg in ("http response sent", "request completed"):
        _dynamo_outcome(t, obj, label)
    elif msg == "image-token count":
        mm = as_int(obj.get("mm_hash"))
        t.images = [ImageInfo("data", width=as_int(obj.get("width")),
                              height=as_int(obj.get("height")), tokens=as_int(obj.get("tokens")),
                              identities={} if mm is None else {"dynamo_mm_hash": f"{mm:016x}"})]
        t.provenance["images"] = label + ":append"
    elif msg == "Selected worker":
        put(t, "worker", None if obj.get("worker_id") is None else str(obj["worker_id"]), label)
    elif (m := _ROUTING_BEST.search(msg)) is not None:
        put(t, "worker", m.group(1), label)
    else:
        return None
    return t


def _dynamo_outcome(t: RequestTrace, obj: dict[str, Any], label: str) -> None:
    put(t, "model", obj.get("model"), label)
    status = as_int(obj.get("status"))
    if status is None and obj.get("status") == "success":
        status = 200
    put(t, "status", status, label)
    if obj.get("status") == "error" or obj.get("request.outcome") == "error":
        # A stream whose worker died after its 200 head: "request completed" says so.
        put(t, "error", str(obj.get("error_detail") or obj.get("error_type") or "error")[:300],
            label)
        put(t, "error_code", obj.get("error_type"), label)
    ms = as_float(obj.get("latency_ms", obj.get("elapsed_ms")))
    put(t, "latency_s", None if ms is None else ms / 1000.0, label)
    put_dynamo_request(t, obj, label)


def put_dynamo_request(t: RequestTrace, fields: dict[str, Any], label: str) -> None:
    """TTFT, worker and token counts under the names Dynamo gives them both in its request
    log lines and in its http-request span's attributes."""
    ttft = as_float(fields.get("ttft_ms"))
    put(t, "ttft_s", None if ttft is None else ttft / 1000.0, label)
    worker = fields.get("decode_worker_id") or fields.get("prefill_worker_id")
    put(t, "worker", None if worker is None else str(worker), label)
    put(t, "completion_tokens", as_int(fields.get("output_tokens")), label)
    put(t, "rendered_tokens", as_int(fields.get("input_tokens")), label)


# SMG debug lines said for every request that carry nothing for routing or the request's
# record: skipped before JSON decoding (most of a debug log's volume).
NOISE_KEY = '"message":"'
NOISE_MESSAGES = ("Token bucket", "Acquired token", "multimodal config cache hit",
                  "Single-router mode", "smg_mm_timing mm_tensor_payload_inline",
                  "Multimodal processing complete", "cache_aware selected",
                  "started processing request")
NOISE = re.compile(re.escape(NOISE_KEY) + "(?:" + "|".join(map(re.escape, NOISE_MESSAGES))
                   + ")")
_NOISE_BYTES = (NOISE_KEY.encode(), tuple(m.encode() for m in NOISE_MESSAGES))


def kept_lines(lines: list[str], first: int = 0) -> list[tuple[int, str]]:
    """The lines that are not noise (``NOISE`` finds nothing in them), numbered from
    ``first``: in one compiled call where ``_lines`` is built, else by the regex."""
    if _native is not None:
        found: list[tuple[int, str]] | None = _native.kept(lines, first, *_NOISE_BYTES)
        if found is not None:
            return found
    search = NOISE.search
    return [(n, line) for n, line in enumerate(lines, first) if not search(line)]


# The messages of SMG lines `router_logs.decision_from` makes decisions of.
SMG_DECISIONS = (*SMG_SELECTIONS, "Cache routing dispatch",
                 "smg_mm_timing process_multimodal_plan", "Token expansion complete",
                 "pipeline attempt failed")
_decode = msgspec.json.Decoder()


def _parse(line: str) -> dict[str, Any] | None:
    """``router_logs.parse_line``, with a faster decoder for the JSON lines most are."""
    if line.startswith("{"):
        try:
            obj = _decode.decode(line)
        except (msgspec.DecodeError, RecursionError):  # nested past msgspec's depth too
            return parse_line(line)
        if isinstance(obj, dict):
            fields = obj.get("fields")
            if isinstance(fields, dict):
                obj = {**obj, **fields}
            evidence = obj.get("evidence")  # SMG's cache trace: JSON inside a JSON string
            if isinstance(evidence, str) and evidence.startswith("{"):
                with contextlib.suppress(msgspec.DecodeError, RecursionError):
                    obj["evidence"] = _decode.decode(evidence)
            return obj
    return parse_line(line)


class Attempts:
    """SMG's dispatch attempt per request across reads of its log: its selection lines
    (``Event-driven routing``, ``Cache-aware selection``) do not say which attempt they
    choose for; the ``pipeline attempt failed`` lines before them do. Bounded: the oldest
    requests are forgotten first (a request's lines are seconds apart)."""

    def __init__(self, limit: int = 20_000) -> None:
        self.failed: dict[str, int] = {}
        self.limit = limit

    def note(self, d: RoutingDecision, msg: str) -> None:
        if d.router != "smg":
            return
        if d.source == "log:attempt_failed" and d.attempt is not None:
            self.failed[d.request_id] = d.attempt + 1
            if len(self.failed) > self.limit:
                for rid in list(self.failed)[: self.limit // 2]:
                    del self.failed[rid]
        elif msg in SMG_SELECTIONS and d.attempt is None:
            d.attempt = self.failed.get(d.request_id, 0)

    def done(self, request_id: str) -> None:
        self.failed.pop(request_id, None)


def read_lines(lines: Iterable[str], errors: dict[str, int] | None = None,
               attempts: Attempts | None = None, first_seq: int | None = None,
               ) -> tuple[list[RoutingDecision], list[RequestTrace]]:
    """Each line parsed once: the routing decisions (``router_logs.decision_from``) and the
    observed-request fragments it carries. ``attempts`` carries SMG's retries over from the
    reads before (a new one per call without it). ``first_seq``: the first line's number in
    its log (the follower's count), kept on SMG's dispatch and completion lines."""
    decisions: list[RoutingDecision] = []
    frags: list[RequestTrace] = []
    smg: dict[str, RequestTrace] = {}
    attempts = Attempts() if attempts is None else attempts
    # Here, not at the top: smg_typed builds on this module's SMG readers.
    from mmlens.ingest import smg_typed

    def other(n: int, line: str) -> None:
        """A line the typed readers leave: its whole object read."""
        seq = None if first_seq is None else n
        try:
            obj = _parse(line)
        except ValueError:
            if errors is not None:
                errors["malformed_log_line"] = errors.get("malformed_log_line", 0) + 1
            return
        if obj is None:
            return
        msg = str(obj.get("message", ""))
        smg_other = "span" in obj and not msg.startswith(SMG_DECISIONS)
        d = None if smg_other else decision_or_count(obj, errors)
        if d is not None:
            if d.ts is None:
                d.ts = parse_ts(obj.get("timestamp") or obj.get("time"))
            attempts.note(d, msg)
            decisions.append(d)
        elif msg == "finished processing request" and isinstance(obj.get("span"), dict):
            attempts.done(str(obj["span"].get("request_id")))
        if msg.startswith("Created AbortOnDropStream"):
            _engine_alias(obj, smg)
        elif isinstance(obj.get("span"), dict):
            smg_fragment(obj, into=smg, seq=seq)  # one fragment per request
        elif msg.startswith(_SMG_STREAM_ENDED):
            frags.append(smg_stream_failure(obj))
        elif (m := COMPLETED.match(msg)) is not None:
            frags.append(smg_stream_end(m.group(1), obj, seq))
        else:
            f = dynamo_fragment(obj)
            if f is not None:
                frags.append(f)

    kept = kept_lines(lines if type(lines) is list else list(lines), first_seq or 0)
    if smg_typed.PATH == "native":  # the typed reading of the loop below, compiled
        smg_typed.NATIVE.read(kept, first_seq is not None, smg, decisions, attempts.failed,
                              attempts.note, errors, other)
    else:
        typed_ok = smg_typed.PATH == "typed"
        for n, line in kept:
            # most SMG lines: one typed decode, straight to their decision and fragment
            try:
                typed = smg_typed.typed_line(line) if typed_ok and line.startswith("{") \
                    and '"span":{' in line else None
            except ValueError:  # text with no UTF-8 form, as `_parse` finds too
                if errors is not None:
                    errors["malformed_log_line"] = errors.get("malformed_log_line", 0) + 1
                continue
            if typed is not None:
                smg_typed.read_typed(typed, None if first_seq is None else n, smg, decisions,
                                     attempts, errors)
            else:
                other(n, line)
    return decisions, list(smg.values()) + coalesce(frags)
