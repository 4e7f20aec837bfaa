"""Observed-request ingest throughput: router log lines and OTLP spans parsed and stored, on
one core (prints figures; not a unit test).

Usage: taskset -c 0 python benchmarks/observed_ingest.py [--requests N] [--encoding json]
    [--routers smg_1.13,dynamo_1.6.1] [--json]

Times are this process's CPU seconds (``time.process_time``): the rate one core sustains,
whatever else runs on the machine.

The real captures (tests/fixtures/captures/: SMG 1.13 JSON debug logs with the cache trace,
its OTLP export with the workers' vLLM-shaped spans; Dynamo 1.6.1 JSONL and its export) are
replayed N times under fresh request and trace ids. Counted: routing decisions (the lines
and span events ``router_logs.decision_from`` turns into decisions) per second, from raw
text/protobuf to rows in a fresh SQLite store (decisions, merged observed requests), with the
log ingest's CPU seconds split into its three steps (lines to records, decision rows, trace
rows) per 10,000 requests. With ``--encoding json`` the exports are sent as OTLP/JSON bodies
(hex ids, integer enums) instead.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import tempfile
import time
import uuid
from pathlib import Path

import msgspec
from google.protobuf import json_format
from mmlens.collectors.observed_sink import ObservedSink
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from mmlens.cli.gc_tuning import tune_gc
from mmlens.ingest.observed_logs import read_lines
from mmlens.ingest.observed_spans import READ_SPANS, read_spans
from mmlens.ingest.otlp import decode_export, span_count, spans_of
from mmlens.ingest.otlp_json import decode_export_json
from mmlens.store.sqlite import Store

# What one collector tick (0.5 s) reads at the rates aimed for, written with one commit per
# tick as the collector does: 20,000 decisions/s ≈ 100,000 SMG debug lines/s; the captured
# exports hold ~10 spans each, so 1,000 of them ≈ 10,000 spans (a quarter second at 40,000
# spans/s; a real exporter batches up to 512 spans per export).
TICK_LINES = 20_000
TICK_EXPORTS = 1_000
CAPTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "captures"


TRACE_ID = re.compile(r"\b[0-9a-f]{32}\b")


def log_lines(prefix: str, copies: int) -> list[tuple[str, list[str]]]:
    """The capture's request lines, each copy under new request and trace ids; with the tag
    of each copy (its spans get the same new ids)."""
    text = (CAPTURES / f"{prefix}_observed_log.jsonl").read_text()
    objs = [json.loads(line) for line in text.splitlines()]
    ids = sorted({o.get("span", {}).get("request_id") or o.get("request_id") or ""
                  for o in objs} - {""}, key=len, reverse=True)
    out = []
    for _ in range(copies):
        tag = uuid.uuid4().hex[:8]
        copy = TRACE_ID.sub(lambda m, tag=tag: m.group(0)[:24] + tag, text)
        for rid in ids:
            copy = copy.replace(rid, f"{rid[:12]}{tag}{rid[12:]}")
        out.append((tag, copy.splitlines()))
    return out


def exports(prefix: str, tags: list[str]) -> list[bytes]:
    bodies = [p.read_bytes() for p in sorted(CAPTURES.glob(f"{prefix}_otlp_export_*.pb"))]
    out = []
    for tag in tags:
        for body in bodies:
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    for sp in ss.spans:
                        sp.trace_id = sp.trace_id[:12] + bytes.fromhex(tag)
                        for kv in sp.attributes:
                            v = kv.value.string_value
                            if kv.value.WhichOneof("value") == "string_value" and len(v) > 12 \
                                    and kv.key in ("request_id", "gen_ai.request.id"):
                                kv.value.string_value = f"{v[:12]}{tag}{v[12:]}"
            out.append(req.SerializeToString())
    return out


def to_otlp_json(body: bytes) -> bytes:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    doc = json_format.MessageToDict(req, use_integers_for_enums=True)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in sp:
                        sp[key] = base64.b64decode(sp[key]).hex()
    return json.dumps(doc).encode()


def run(prefix: str, copies: int, store: Store, encoding: str = "pb") -> dict[str, float]:
    """Log lines, then span exports, each parsed and stored; counts and seconds of each."""
    tagged = log_lines(prefix, copies)
    lines = [line for _, chunk in tagged for line in chunk]
    bodies = exports(prefix, [tag for tag, _ in tagged])
    decode = decode_export
    if encoding == "json":
        bodies, decode = [to_otlp_json(b) for b in bodies], decode_export_json
    sink = ObservedSink(store.add_traces, store.add_decisions, hold_s=0.0)
    # As `mmlens collect` does once started; here it also keeps the corpus held in memory
    # (no part of a collector's heap) out of every collection.
    tune_gc()
    t0 = time.process_time()
    log_dec, split = store_lines(lines, store, sink)
    t1 = time.process_time()
    span_dec = spans = 0
    for i, body in enumerate(bodies):
        req = decode(body)
        frags, decisions = read_spans(spans_of(req, READ_SPANS))
        spans += span_count(req)
        span_dec += len(decisions)
        sink.add(frags, decisions)
        if i % TICK_EXPORTS == TICK_EXPORTS - 1:  # one write per tick, not per export
            sink.flush(force=True)
    sink.flush(force=True)
    t2 = time.process_time()
    rows = store.db.execute("SELECT count(*) FROM traces").fetchone()[0]
    return {"lines": len(lines), "log_decisions": log_dec, "log_s": t1 - t0, "spans": spans,
            "span_decisions": span_dec, "span_s": t2 - t1, "requests": rows,
            "decode_s": decode_floor(lines), **split}


def store_lines(lines: list[str], store: Store, sink: ObservedSink,
                ) -> tuple[int, dict[str, float]]:
    """Log lines parsed and stored a collector tick's worth at a time: the decisions, and the
    CPU seconds of each step (lines to records, decision rows, trace rows)."""
    clock = time.process_time
    n = 0
    split = {"read_s": 0.0, "decision_rows_s": 0.0, "trace_rows_s": 0.0}
    for i in range(0, len(lines), TICK_LINES):
        a = clock()
        decisions, frags = read_lines(lines[i:i + TICK_LINES])
        b = clock()
        store.add_decisions(decisions)
        c = clock()
        n += len(decisions)
        sink.add(frags)
        sink.flush(force=True)
        split["read_s"] += b - a
        split["decision_rows_s"] += c - b
        split["trace_rows_s"] += clock() - c
    return n, split


def decode_floor(lines: list[str]) -> float:
    """CPU seconds msgspec takes to decode every line (the floor beside log ingest); a
    line that is not JSON is skipped as the reader skips it."""
    decode = msgspec.json.decode
    t0 = time.process_time()
    for line in lines:
        try:
            decode(line)
        except msgspec.DecodeError:
            pass
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=20_000,
                    help="requests per router (each capture holds 5)")
    ap.add_argument("--encoding", choices=("pb", "json"), default="pb",
                    help="OTLP export bodies as protobuf or OTLP/JSON")
    ap.add_argument("--routers", default="smg_1.13,dynamo_1.6.1")
    ap.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    args = ap.parse_args()
    copies = max(1, args.requests // 5)
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for prefix in args.routers.split(","):
            store = Store(Path(tmp) / f"{prefix}.db")
            r = run(prefix, copies, store, args.encoding)
            store.close()
            figures[prefix] = r
            print(f"{prefix} logs: {r['lines']} lines, {r['log_decisions']} decisions in "
                  f"{r['log_s']:.2f} s → {r['log_decisions'] / r['log_s']:,.0f} decisions/s "
                  f"({r['lines'] / r['log_s']:,.0f} lines/s); msgspec decode of the same "
                  f"lines {r['lines'] / r['decode_s']:,.0f} lines/s (ratio "
                  f"{r['decode_s'] / r['log_s']:.2f}x)")
            per = 10_000 / max(1, r["requests"])  # where the log ingest's time went
            print(f"{prefix} logs per 10,000 requests: lines → records "
                  f"{r['read_s'] * per:.2f} s, decision rows {r['decision_rows_s'] * per:.2f} s, "
                  f"trace rows {r['trace_rows_s'] * per:.2f} s")
            print(f"{prefix} spans ({args.encoding}): {r['spans']} spans, "
                  f"{r['span_decisions']} decisions in "
                  f"{r['span_s']:.2f} s → {r['spans'] / r['span_s']:,.0f} spans/s, "
                  f"{r['span_decisions'] / r['span_s']:,.0f} decisions/s; "
                  f"{r['requests']} observed requests stored")
    if args.json:
        print(json.dumps({"observed": figures}))


if __name__ == "__main__":
    main()
