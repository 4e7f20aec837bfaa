"""OTLP spans → observed-request fragments and routing decisions.

What each real exporter sends (captures in tests/fixtures/captures/, see its README):

- SMG 1.13 (``--enable-trace``): ``http_request`` (``request_id``, ``path``, ``status_code``,
  ``latency`` in µs) with a child ``grpc_execute`` (``request_id`` = the engine id
  ``<rid>-<uuid>``, ``model``, ``mode``); no worker, no prediction, no usage. SMG passes
  ``traceparent`` to gRPC workers (parent = ``grpc_execute``).
- Dynamo 1.6.1 (``OTEL_EXPORT_ENABLED=1``): ``http-request`` (``request_id``, ``model``,
  ``input_tokens`` before image expansion, ``output_tokens``, ``image_count``, ``ttft_ms``,
  ``decode_worker_id``) whose events are the request's log lines (``image-token count`` with
  width/height/tokens/mm_hash, …); ``kv_router.route_request`` (``worker_id``,
  ``overlap_blocks``); ``kv_router.select_worker`` with the ``[ROUTING] Best … X/Y blocks
  overlap`` event (``total_blocks``). No usage of the engine (cached tokens).
- vLLM workers: ``llm_request`` (SERVER) with ``gen_ai.request.id``, ``gen_ai.response.model``,
  ``gen_ai.usage.prompt_tokens``/``completion_tokens`` (``gen_ai.usage.cached_tokens`` where
  the worker sets it), ``gen_ai.latency.time_to_first_token``/``e2e``, in the trace of the
  router's request; the worker is named by ``service.instance.id`` when the deployment sets it.
"""

from __future__ import annotations

from collections.abc import Iterable

from mmlens.ingest.numbers import as_float, as_int
from mmlens.ingest.observed import SOURCE_OTLP, fragment, is_request_path, put
from mmlens.ingest.observed_logs import dynamo_fragment, put_dynamo_request
from mmlens.ingest.router_logs import decision_from
from mmlens.records import RequestTrace, RoutingDecision, SpanRecord

CACHED_ATTRS = ("gen_ai.usage.cached_tokens", "gen_ai.usage.cache_read.input_tokens",
                "gen_ai.usage.cache_read_input_tokens")




def _base(sp: SpanRecord, rid: str, kind: str) -> RequestTrace:
    t = fragment(rid, SOURCE_OTLP, sp.start_ns / 1e9, kind)
    t.trace_id = sp.trace_id or None
    return t


def _smg_http(sp: SpanRecord) -> RequestTrace | None:
    a = sp.attributes
    if not a.get("request_id") or not is_request_path(a.get("path")):
        return None
    t = _base(sp, str(a["request_id"]), "smg")
    label = "otlp:smg.http_request"
    put(t, "status", as_int(a.get("status_code")), label)
    lat = as_float(a.get("latency"))
    put(t, "latency_s", (sp.end_ns - sp.start_ns) / 1e9 if lat is None else lat / 1e6, label)
    return t


def _smg_execute(sp: SpanRecord) -> RequestTrace | None:
    a = sp.attributes
    if not a.get("request_id"):
        return None
    t = _base(sp, str(a["request_id"]), "smg")
    put(t, "model", a.get("model"), "otlp:smg.grpc_execute")
    return t


def _dynamo_http(sp: SpanRecord) -> RequestTrace | None:
    a = sp.attributes
    if not a.get("request_id") or not is_request_path(a.get("uri")):
        return None
    t = _base(sp, str(a["request_id"]), "dynamo")
    label = "otlp:dynamo.http-request"
    put(t, "model", a.get("model"), label)
    put(t, "latency_s", (sp.end_ns - sp.start_ns) / 1e9, label)
    put_dynamo_request(t, a, label)
    if a.get("request.outcome") == "success" or sp.status_code == 1:
        put(t, "status", 200, label)
    for ev in sp.events:
        f = dynamo_fragment({"message": ev.name, "request_id": a["request_id"],
                             **ev.attributes}, SOURCE_OTLP, ev.ts_ns / 1e9 or None)
        if f is not None and f.images:
            t.images += f.images
            t.provenance["images"] = "otlp:dynamo.http-request"
    return t


def _llm_request(sp: SpanRecord) -> RequestTrace | None:
    a = sp.attributes
    rid = a.get("gen_ai.request.id")
    if not rid:
        return None
    t = _base(sp, str(rid), "auto")
    label = "otlp:llm_request"
    put(t, "model", a.get("gen_ai.response.model"), label)
    put(t, "prompt_tokens", as_int(a.get("gen_ai.usage.prompt_tokens")), label)
    put(t, "completion_tokens", as_int(a.get("gen_ai.usage.completion_tokens")), label)
    cached = next((a[k] for k in CACHED_ATTRS if k in a), None)
    put(t, "cached_tokens", as_int(cached), label)
    put(t, "ttft_s", as_float(a.get("gen_ai.latency.time_to_first_token")), label)
    instance = sp.resource.get("service.instance.id")
    put(t, "worker", None if instance is None else str(instance), "otlp:resource")
    return t


_BY_NAME = {"http_request": _smg_http, "grpc_execute": _smg_execute,
            "http-request": _dynamo_http, "llm_request": _llm_request}
# The spans read here (for ``otlp.spans_of``): these by name, and any span with events.
READ_SPANS = frozenset(_BY_NAME)


def fragment_of(sp: SpanRecord) -> RequestTrace | None:
    fn = _BY_NAME.get(sp.name)
    return fn(sp) if fn is not None else None


def decisions_of(sp: SpanRecord) -> list[RoutingDecision]:
    """Routing decisions carried by span events (Dynamo's ``[ROUTING] Best …`` and
    ``Selected worker`` lines inside ``kv_router.select_worker``)."""
    out: list[RoutingDecision] = []
    for ev in sp.events:
        rid = ev.attributes.get("request_id") or sp.attributes.get("request_id")
        if not rid:
            continue
        d = decision_from({"message": ev.name, **ev.attributes, "request_id": rid})
        if d is not None:
            d.source = "otlp:" + d.source.removeprefix("log:")
            d.ts = ev.ts_ns / 1e9 if ev.ts_ns else sp.start_ns / 1e9
            out.append(d)
    return out


def read_spans(spans: Iterable[SpanRecord]) -> tuple[list[RequestTrace], list[RoutingDecision]]:
    frags: list[RequestTrace] = []
    decisions: list[RoutingDecision] = []
    for sp in spans:
        f = fragment_of(sp)
        if f is not None:
            frags.append(f)
        if sp.events:
            decisions += decisions_of(sp)
    return frags, decisions
