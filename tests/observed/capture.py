"""Re-record the observed-traffic captures in tests/fixtures/captures/ from the real routers.

    python -m tests.observed.capture smg|dynamo|otel-js

Starts the external cluster (real SMG 1.13 gRPC or Dynamo 1.6.1 frontend, simulated workers
started here) with tracing on: the router exports OTLP/gRPC, the workers export their
vLLM-shaped `llm_request` spans over OTLP/HTTP, both to an in-process receiver that keeps
every export body. Sends five requests with the official `openai` client (red 64×64, red
again, blue 224×224 — the same 64 image tokens, another image —, text only, red streamed)
and writes: the export bodies (`<router>_otlp_export_<n>.pb`), the router's JSON log lines
of those requests (`<router>_observed_log.jsonl`) and what the client got back
(`<router>_observed_responses.json`). Local model paths are rewritten to `/models/...`.

`otel-js` runs `fixtures/captures/otel_js/export.mjs` (the OpenTelemetry JS SDK, OTLP/HTTP
JSON; `npm ci` there first) against the receiver and keeps its body as
`otel_js_otlp_export.json`.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")  # we spawn while gRPC runs

import base64
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai
from mmlens.collectors.otlp_receiver import OtlpReceiver
from openai.types.chat import ChatCompletionContentPartParam, ChatCompletionMessageParam
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from mmlens.layout.synthetic_images import synthetic_png
from tests.observed.external import MODEL, dynamo_cluster, smg_cluster

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "captures"
TEXT = "Describe this image in detail please."


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


RED = data_url(synthetic_png("solid", 64, 64, rgb=(200, 30, 30)))
BLUE = data_url(synthetic_png("solid", 224, 224, rgb=(30, 30, 200)))
WORKLOAD = [("red", RED, False), ("red-again", RED, False), ("blue", BLUE, False),
            ("text", None, False), ("red-stream", RED, True)]


def messages(image: str | None) -> list[ChatCompletionMessageParam]:
    content: list[ChatCompletionContentPartParam] = [
        {"type": "image_url", "image_url": {"url": image}}] \
        if image else []
    return [{"role": "user", "content": [*content, {"type": "text", "text": TEXT}]}]


def send(client: openai.OpenAI) -> list[dict[str, Any]]:
    out = []
    for name, image, stream in WORKLOAD:
        if stream:
            chunks = list(client.chat.completions.create(
                model=MODEL, messages=messages(image), max_tokens=8, stream=True,
                stream_options={"include_usage": True}))
            usage = next((c.usage for c in chunks if c.usage), None)
            out.append({"name": name, "id": chunks[0].id, "headers": {},
                        "usage": usage.model_dump(exclude_none=True) if usage else None})
            continue
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages(image), max_tokens=8)
        body = raw.parse()
        out.append({"name": name, "id": body.id,
                    "headers": {k: v for k, v in raw.headers.items() if k.startswith("x-")},
                    "usage": body.usage.model_dump(exclude_none=True) if body.usage else None})
    return out


def scrub(text: str, roots: list[str]) -> str:
    for root in roots:
        text = text.replace(root, "/models")
    return text


def scrub_export(body: bytes, roots: list[str]) -> bytes:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)

    def fix(kvs: Any) -> None:
        for kv in kvs:
            if kv.value.WhichOneof("value") == "string_value":
                kv.value.string_value = scrub(kv.value.string_value, roots)

    for rs in req.resource_spans:
        fix(rs.resource.attributes)
        for ss in rs.scope_spans:
            for sp in ss.spans:
                fix(sp.attributes)
                for ev in sp.events:
                    fix(ev.attributes)
    return req.SerializeToString()


def main(which: str) -> None:
    from mmlens.demo.model_dirs import ensure_model_dir

    roots = [str(ensure_model_dir("qwen3-vl").parent)]
    dump = Path(tempfile.mkdtemp(prefix="mmlens-capture-"))
    rx = OtlpReceiver(lambda spans: None, grpc_port=0, http_port=0, dump_dir=dump).start()
    cluster = smg_cluster if which == "smg" else dynamo_cluster
    try:
        with cluster(24800, otlp_grpc=f"127.0.0.1:{rx.grpc_port}",
                     worker_otlp=f"http://127.0.0.1:{rx.http_port}",
                     log_dir=dump / "logs") as ext:
            responses = send(openai.OpenAI(base_url=ext.router_url + "/v1", api_key="none"))
            time.sleep(7)  # routers batch spans for up to 5 s
            assert ext.router_log is not None
            log_lines = ext.router_log.read_text().splitlines()
    finally:
        rx.stop()
    prefix = "smg_1.13" if which == "smg" else "dynamo_1.6.1"
    for i, path in enumerate(sorted(dump.glob("*.pb"))):
        (OUT / f"{prefix}_otlp_export_{i}.pb").write_bytes(
            scrub_export(path.read_bytes(), roots))
    keep = [scrub(line, roots) for line in log_lines
            if ("chat/completions" in line or "request_id" in line) and "/readiness" not in line
            and "/health" not in line and "/metrics" not in line]
    (OUT / f"{prefix}_observed_log.jsonl").write_text("\n".join(keep) + "\n")
    (OUT / f"{prefix}_observed_responses.json").write_text(json.dumps(responses, indent=1))
    print(f"{prefix}: {len(list(dump.glob('*.pb')))} exports, {len(keep)} log lines, "
          f"{len(responses)} responses")


def capture_otel_js() -> None:
    script_dir = OUT / "otel_js"
    if not (script_dir / "node_modules").is_dir():
        sys.exit(f"run `npm ci` in {script_dir.relative_to(Path.cwd())} first")
    dump = Path(tempfile.mkdtemp(prefix="mmlens-capture-"))
    with OtlpReceiver(lambda spans: None, grpc_port=None, http_port=0, dump_dir=dump) as rx:
        url = f"http://127.0.0.1:{rx.http_port}/v1/traces"
        subprocess.run(["node", "export.mjs", url], cwd=script_dir, check=True, timeout=60)
        errors = dict(rx.health.errors)
    bodies = sorted(dump.glob("*.json"))
    if len(bodies) != 1 or errors:
        sys.exit(f"expected one JSON export and no errors, got {len(bodies)} and {errors}")
    (OUT / "otel_js_otlp_export.json").write_bytes(bodies[0].read_bytes())
    print(f"otel-js: {bodies[0].stat().st_size} bytes")


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "smg"
    capture_otel_js() if which == "otel-js" else main(which)
