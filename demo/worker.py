"""One simulated vLLM GPU worker process: gRPC engine service, HTTP API, /metrics, KV events.

Run: python -m mmlens.demo.worker --name w1 --model-dir DIR --family qwen3-vl --grpc-port P ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
import uvicorn
from mmlens.demo.engine import Engine, LatencyModel
from mmlens.demo.expansion import Expander
from mmlens.demo.grpc_service import start_grpc_server, stop_grpc_server
from mmlens.demo.http_api import build_app
from mmlens.demo.kv_publisher import KvPublisher
from mmlens.demo.media import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, DecodedImage, decode_async
from mmlens.demo.model_dirs import MODELS
from mmlens.demo.otlp_export import SpanExporter
from mmlens.demo.prefix_cache import MediaSpan, PrefixCache, SglangPrefixCache
from mmlens.demo.worker_metrics import SglangMetrics, WorkerMetrics
from tokenizers import Tokenizer

ANSWER = (" The picture shows a simulated scene. This demo worker answers every request with"
          " the same deterministic words, chosen by a hash of the prompt, so repeated requests"
          " get identical answers.")


class WorkerState:
    """Everything one worker process shares between its gRPC and HTTP front ends."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.name = args.name
        self.model = MODELS[args.family]
        model_dir = Path(args.model_dir)
        self.model_dir = model_dir.resolve()
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tok_cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
        self.template = jinja2.Environment().from_string(tok_cfg["chat_template"])
        processor_config = json.loads((model_dir / self.model.processor_file).read_text())
        self.expander = Expander(self.model, processor_config, self.encode, args.count_drift)
        self.max_model_len = args.max_model_len
        self.max_num_seqs = 256
        self.vllm_version = "0.26.0"
        self.mm_processor = args.mm_processor
        self.allowed_hosts = frozenset(h for h in args.allowed_media_hosts.split(",") if h)
        self.max_image_bytes = args.max_image_bytes
        self.max_image_pixels = args.max_image_pixels
        # vllm | sglang: the wire protocols (gRPC service, metric names, KV-event encoding
        # and block hashes) this worker speaks.
        self.engine_kind = args.engine
        sglang = args.engine == "sglang"
        self.metrics = (SglangMetrics if sglang else WorkerMetrics)(
            self.model.served_name, args.block_size, args.num_blocks, args.max_model_len)
        self.publisher = KvPublisher(
            f"tcp://127.0.0.1:{args.kv_port}" if args.kv_port else None,
            f"tcp://127.0.0.1:{args.replay_port}" if args.replay_port else None,
            topic=args.kv_topic, legacy=args.legacy_kv_encoding, engine=args.engine)
        self.engine = Engine(
            (SglangPrefixCache if sglang else PrefixCache)(
                block_size=args.block_size, num_blocks=args.num_blocks,
                seed=args.hash_seed.encode()),
            self.publisher, self.metrics, self.encode(ANSWER),
            LatencyModel(speed=args.speed), max_model_len=args.max_model_len,
            request_log=self._log_request_stats if args.log_requests else None)
        self.started = time.time()
        self.tracer = (SpanExporter(args.otlp_traces_endpoint, instance=args.otlp_instance
                                    or f"grpc://127.0.0.1:{args.grpc_port}")
                       if args.otlp_traces_endpoint else None)
        self.last_receive = 0.0
        self.seen: deque[dict[str, Any]] = deque(maxlen=200)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def render(self, messages: list[dict[str, Any]]) -> list[int]:
        return self.encode(self.template.render(messages=messages, add_generation_prompt=True))

    def gen_throughput(self) -> float:
        return self.engine.latency.decode_tokens_per_s * self.engine.latency.speed

    async def decode(self, url: str) -> DecodedImage:
        return await decode_async(url, self.model.served_name, self.allowed_hosts,
                                  self.max_image_bytes, self.max_image_pixels)

    def _log_request_stats(self, stats: dict[str, Any]) -> None:
        print(json.dumps({**stats, "worker": self.name}), flush=True)

    def log_request(self, transport: str, rid: str, prompt: Sequence[int],
                    media: Sequence[MediaSpan], grpc_request: Any,
                    metadata: dict[str, str] | None = None) -> None:
        entry: dict[str, Any] = {
            "transport": transport, "request_id": rid, "t": time.time(),
            "prompt_ids": list(prompt),
            "media": [{"identifier": m.identifier, "offset": m.offset, "length": m.length}
                      for m in media],
            "metadata": metadata or {},
        }
        if grpc_request is not None:
            entry["media_refs"] = len(grpc_request.media_refs.items)
            entry["original_text"] = grpc_request.tokenized.original_text
            if grpc_request.HasField("mm_inputs"):
                mm = grpc_request.mm_inputs
                entry["im_token_id"] = mm.im_token_id
                entry["mm_hashes"] = list(mm.mm_hashes)
                entry["pixel_values_shape"] = list(mm.pixel_values.shape)
        self.seen.append(entry)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def,override]
        yield  # the worker's own handler stops everything


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmlens.demo.worker", description=__doc__)
    p.add_argument("--name", default="w1")
    p.add_argument("--family", choices=sorted(MODELS), default="qwen3-vl")
    p.add_argument("--engine", choices=["vllm", "sglang"], default="vllm",
                   help="whose wire protocols to speak (gRPC service, metrics, KV events)")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--kv-port", type=int, default=0, help="ZMQ PUB port (0: off)")
    p.add_argument("--replay-port", type=int, default=0, help="ZMQ ROUTER replay port (0: off)")
    p.add_argument("--kv-topic", default="kv-events")
    p.add_argument("--legacy-kv-encoding", action="store_true",
                   help="encode events as positional arrays (vLLM before PR #42892)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--hash-seed", default="mmlens-demo")
    p.add_argument("--speed", type=float, default=1.0, help="latency divisor")
    p.add_argument("--log-requests", action="store_true",
                   help="print one JSON line per finished request (prompt and cached tokens)")
    p.add_argument("--mm-processor", default="", choices=["", "inprocess"],
                   help="advertise worker-side media processing (accept media_refs)")
    p.add_argument("--count-drift", type=int, default=0,
                   help="add N to this worker's image-token count (estimator mismatch)")
    p.add_argument("--allowed-media-hosts", default="",
                   help="comma-separated host:port entries whose http(s) images may be "
                   "fetched (host:* allows every port of a host; default: none)")
    p.add_argument("--max-image-bytes", type=int, default=DEFAULT_MAX_BYTES)
    p.add_argument("--max-image-pixels", type=int, default=DEFAULT_MAX_PIXELS)
    p.add_argument("--otlp-traces-endpoint", default="",
                   help="export a vLLM-shaped llm_request span per request (OTLP/HTTP URL)")
    p.add_argument("--otlp-instance", default="",
                   help="service.instance.id of the spans (default: the gRPC URL)")
    return p.parse_args(list(argv))


async def serve(args: argparse.Namespace) -> None:
    state = WorkerState(args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    state.publisher.start()
    grpc_server = await start_grpc_server(state, "127.0.0.1", args.grpc_port)
    http = _Server(uvicorn.Config(build_app(state), host="127.0.0.1", port=args.http_port,
                                  log_level="warning", lifespan="off", access_log=False))
    http_task = asyncio.create_task(http.serve())
    while not http.started and not http_task.done():
        await asyncio.sleep(0.02)
    if http_task.done():
        raise OSError(f"HTTP server on port {args.http_port} failed to start")
    print(json.dumps({"event": "worker_ready", "name": args.name, "grpc": args.grpc_port,
                      "http": args.http_port}), flush=True)
    await stop.wait()
    http.should_exit = True
    await stop_grpc_server(grpc_server)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(http_task, 3)
    state.publisher.close()
    if state.tracer is not None:
        state.tracer.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
