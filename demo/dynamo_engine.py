"""A simulated vLLM worker registered with the real Dynamo runtime as a custom Python engine.

The Dynamo frontend tokenizes and renders the chat (one placeholder per image), routes on its
pad-value view and forwards the image URLs plus `extra_args.mm_hashes` (16 hex per image).
This engine does what a vLLM worker behind Dynamo does, with the demo's engine model:

- fetches each image (data: URLs; http only from allowed hosts) and expands its placeholder
  with N from the core family formula (`Expander`, optional `--count-drift`);
- keys an image by Dynamo's mm_hash padded to 64 hex (vLLM's `multi_modal_uuids`); without
  mm_hashes (the frontend fell back to text-prefix routing) by its own pixel hash, as vLLM;
- caches the sequence in the demo's paged prefix cache and reports `usage.prompt_tokens`
  (expanded length) and `prompt_tokens_details.cached_tokens`;
- publishes its KV events to Dynamo (`KvEventPublisher.publish_stored/removed`) with image
  runs already normalized to Dynamo's pad values (1_000_000 + (mm_hash & 0x3FFFFFFF)), the
  form Dynamo's router gives vLLM events before hashing, so MM-aware overlap shows with KV
  events on; optionally the same events in vLLM's ZMQ format for mmlens' own KV collector;
- serves `vllm:*` metrics on the runtime's `/metrics` (`DYN_SYSTEM_PORT`).

Run (inside the demo's environment): python -m mmlens.demo.dynamo_engine --model-dir DIR ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

from dynamo._core import Context
from dynamo.common.backend.engine import (
    EngineConfig,
    GenerateChunk,
    GenerateRequest,
    LLMEngine,
    LlmRegistration,
)
from dynamo.common.backend.metrics import register_engine_registry
from dynamo.common.backend.publisher import ComponentSnapshot, KvEventSource, PushSource
from dynamo.common.backend.run import run
from dynamo.common.backend.worker import WorkerConfig
from mmlens.demo.dynamo_kv_sink import DynamoKvSink, FanOut
from mmlens.demo.engine import Engine, EngineError, LatencyModel
from mmlens.demo.expansion import Expander, PlaceholderMismatch
from mmlens.demo.kv_publisher import KvPublisher
from mmlens.demo.media import DecodedImage, MediaError, decode_async
from mmlens.demo.model_dirs import MODELS
from mmlens.demo.otlp_export import SpanExporter, TraceContext, traced_steps
from mmlens.demo.prefix_cache import MediaSpan, PrefixCache
from mmlens.demo.worker import ANSWER
from mmlens.demo.worker_metrics import WorkerMetrics
from tokenizers import Tokenizer

from mmlens.layout.hashing import dynamo_pad_value

HOST = "127.0.0.1"


def vllm_uuid(mm_hash_hex: str) -> str:
    """Dynamo's vLLM handler pads the 16-hex mm_hash to 64 hex for `multi_modal_uuids`."""
    return mm_hash_hex.lower().ljust(64, "0")


def image_urls(request: GenerateRequest) -> list[str]:
    items = (request.get("multi_modal_data") or {}).get("image_url") or []
    urls: list[str] = []
    for item in items:
        if isinstance(item, dict):
            url = item.get("Url") or item.get("url")
            if isinstance(url, str):
                urls.append(url)
        elif isinstance(item, str):
            urls.append(item)
    return urls


def normalize_image_runs(ids: list[int], spans: Sequence[MediaSpan], pad_token: int,
                         pads: Sequence[int | None]) -> list[int]:
    """Replace each image's pad-token run by its Dynamo pad value (where one is known)."""
    out = list(ids)
    for span, pad in zip(spans, pads, strict=True):
        if pad is None:
            continue
        for i in range(span.offset, span.offset + span.length):
            if out[i] == pad_token:
                out[i] = pad
    return out


class SimulatedVllmEngine(LLMEngine):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.model = MODELS[args.family]
        self.model_dir = Path(args.model_dir).resolve()
        self.worker_id: int | None = None
        self.sink = DynamoKvSink()
        self.zmq: KvPublisher | None = None
        self.engine: Engine | None = None
        self.snapshots: Any = None
        self.kv_relay: Any = None
        self.log = sys.stdout
        self.tracer: SpanExporter | None = None

    # -- lifecycle -----------------------------------------------------------------------
    @classmethod
    async def from_args(cls, argv: list[str] | None = None,
                        ) -> tuple[SimulatedVllmEngine, WorkerConfig]:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        engine = cls(args)
        config = WorkerConfig(
            namespace=args.namespace, component=args.component, endpoint=args.endpoint,
            model_name=str(engine.model_dir), served_model_name=engine.model.served_name,
            discovery_backend=args.discovery_backend, request_plane="tcp",
            event_plane=args.event_plane,
            enable_kv_routing=not args.no_kv_events)
        return engine, config

    async def start(self, worker_id: int) -> EngineConfig:
        a = self.args
        self.worker_id = worker_id
        self.tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        processor_config = json.loads((self.model_dir / self.model.processor_file).read_text())
        self.expander = Expander(self.model, processor_config, self.encode, a.count_drift)
        self.pad_token = self.model.token_id(self.model.core.pad)
        self.allowed_hosts = frozenset(h for h in a.allowed_media_hosts.split(",") if h)
        if a.otlp_traces_endpoint:
            self.tracer = SpanExporter(a.otlp_traces_endpoint, instance=str(worker_id))
        self.metrics = WorkerMetrics(self.model.served_name, a.block_size, a.num_blocks,
                                     a.max_model_len)
        # kv-path "pad": events reach Dynamo through its Python publisher with image runs
        # already in pad-value form. "vllm-zmq": as a real vLLM engine, raw image-token runs
        # plus extra_keys (64-hex identifiers) on a ZMQ PUB socket that Dynamo's worker
        # subscribes to and normalizes itself.
        sinks: list[Any] = [] if a.kv_path == "vllm-zmq" else [self.sink]
        if a.zmq_kv_port:
            self.zmq = KvPublisher(f"tcp://{HOST}:{a.zmq_kv_port}",
                                   f"tcp://{HOST}:{a.zmq_replay_port}"
                                   if a.zmq_replay_port else None, topic="kv-events",
                                   legacy=a.zmq_legacy_encoding)
            self.zmq.start()
            sinks.append(self.zmq)
        self.engine = Engine(
            PrefixCache(block_size=a.block_size, num_blocks=a.num_blocks,
                        seed=a.hash_seed.encode()),
            FanOut(sinks), self.metrics, self.encode(ANSWER), LatencyModel(speed=a.speed),
            max_model_len=a.max_model_len)
        self._emit({"event": "worker_ready", "name": a.name, "worker_id": worker_id,
                    "model": self.model.served_name, "block_size": a.block_size,
                    "zmq_kv_port": a.zmq_kv_port or None})
        return EngineConfig(
            model=str(self.model_dir), served_model_name=self.model.served_name,
            llm=LlmRegistration(context_length=a.max_model_len,
                                kv_cache_block_size=a.block_size,
                                total_kv_blocks=a.num_blocks, max_num_seqs=256,
                                max_num_batched_tokens=8192))

    async def kv_event_sources(self) -> list[KvEventSource]:
        if self.args.kv_path == "vllm-zmq":
            return []  # relayed by our own publisher (`on_endpoint_ready`)
        return [PushSource(on_ready=self.sink.attach, dp_rank=0)]

    async def on_endpoint_ready(self, endpoint: Any) -> None:
        """vllm-zmq: relay the engine's ZMQ events as Dynamo's vLLM worker does, with the
        image-placeholder id that lets the relay rewrite image runs to pad values.
        (The backend framework's `ZmqSource` carries no image token id, so events relayed
        through it keep raw image runs and never match the router's view.)"""
        if self.args.kv_path != "vllm-zmq" or self.args.no_kv_events:
            return
        from dynamo._core import resolve_routing_image_token_id
        from dynamo.llm import KvEventPublisher

        image_token_id = resolve_routing_image_token_id(self.model.served_name,
                                                        str(self.model_dir))
        self.kv_relay = KvEventPublisher(
            endpoint=endpoint, kv_block_size=self.args.block_size, dp_rank=0,
            enable_local_indexer=True, zmq_endpoint=f"tcp://{HOST}:{self.args.zmq_kv_port}",
            zmq_topic="kv-events", image_token_id=image_token_id)
        self._emit({"event": "kv_relay", "image_token_id": image_token_id,
                    "zmq_endpoint": f"tcp://{HOST}:{self.args.zmq_kv_port}"})

    def component_metrics_dp_ranks(self) -> list[int]:
        return [0]

    def attach_snapshot_publisher(self, publisher: Any) -> None:
        self.snapshots = publisher

    async def register_prometheus(self, metrics: Any) -> None:
        register_engine_registry(metrics, self.metrics.registry, prefix_filters=["vllm:"])

    async def abort(self, context: Context) -> None:
        if self.engine is not None:
            self.engine.aborted.add(context.id())

    async def cleanup(self) -> None:
        if self.tracer is not None:
            self.tracer.close()
            self.tracer = None
        if self.kv_relay is not None:
            with contextlib.suppress(Exception):
                self.kv_relay.shutdown()
            self.kv_relay = None
        if self.zmq is not None:
            self.zmq.close()
            self.zmq = None

    # -- helpers -------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _emit(self, record: dict[str, Any]) -> None:
        print(json.dumps(record), file=self.log, flush=True)

    def _snapshot(self) -> None:
        if self.snapshots is None or self.engine is None:
            return
        cache = self.engine.cache
        used = sum(1 for c in cache.ref_count.values() if c > 0)
        with contextlib.suppress(Exception):
            self.snapshots.publish(0, ComponentSnapshot(
                kv_used_blocks=used, kv_total_blocks=cache.num_blocks,
                gpu_cache_usage=cache.usage(), dp_rank=0,
                kv_cache_hit_rate=self.engine.cache_hit_rate()
                if self.engine.query_tokens_total else None))

    async def _images(self, urls: Sequence[str], mm_hashes: Sequence[str],
                      ) -> tuple[list[DecodedImage], list[int | None]]:
        decoded = await asyncio.gather(*(decode_async(
            url, self.model.served_name, self.allowed_hosts) for url in urls))
        exact = len(mm_hashes) == len(decoded)
        images: list[DecodedImage] = []
        pads: list[int | None] = []
        for i, img in enumerate(decoded):
            if exact:
                images.append(dataclasses.replace(img, identifier=vllm_uuid(mm_hashes[i])))
                pads.append(dynamo_pad_value(int(mm_hashes[i][:16], 16)))
            else:
                images.append(img)
                pads.append(None)
        return images, pads

    # -- serving -------------------------------------------------------------------------
    async def generate(self, request: GenerateRequest, context: Context,
                       ) -> AsyncGenerator[GenerateChunk, None]:
        assert self.engine is not None
        rid = context.id()
        token_ids = list(request.get("token_ids") or [])
        extra = request.get("extra_args") or {}
        mm_hashes = [str(h) for h in extra.get("mm_hashes") or []]
        max_tokens = int((request.get("stop_conditions") or {}).get("max_tokens") or 16)
        try:
            images, pads = await self._images(image_urls(request), mm_hashes)
            expanded, spans = self.expander.expand(token_ids, images)
        except (MediaError, PlaceholderMismatch, OSError) as exc:
            # Dynamo answers a bare 400 "Invalid request": the reason goes to the log too.
            self._emit({"event": "refused", "t": time.time(), "name": self.args.name,
                        "request_id": rid, "reason": str(exc)})
            raise ValueError(f"simulated vLLM worker refused the request: {exc}") from exc
        prompt = (expanded if self.args.kv_path == "vllm-zmq" else
                  normalize_image_runs(expanded, spans, self.pad_token, pads))
        routing = request.get("mm_routing_info") or {}
        routing_ids = routing.get("routing_token_ids")
        routing_len = routing.get("expanded_prompt_len")
        record: dict[str, Any] = {
            "event": "request", "t": time.time(), "name": self.args.name,
            "worker_id": self.worker_id, "request_id": rid,
            "rendered_tokens": len(token_ids), "prompt_tokens": len(prompt),
            "images": [{"width": im.width, "height": im.height,
                        "tokens": self.expander.image_tokens(im.width, im.height),
                        "identifier": im.identifier} for im in images],
            "mm_hashes": mm_hashes, "routing_expanded_len": routing_len,
            "matches_router_view": (None if routing_ids is None else
                                    list(routing_ids[: len(prompt)]) == prompt
                                    and routing_len == len(prompt)),
        }
        final: dict[str, Any] | None = None
        pending: list[int] | None = None
        try:
            steps = traced_steps(self.engine.run(rid, prompt, spans, max_tokens), self.tracer,
                                 rid, self.model.served_name, max_tokens, _context_of(context))
            async for toks, result in steps:
                if pending is not None:
                    yield {"token_ids": pending, "index": 0}
                pending = toks
                final = {"prompt_tokens": result.prompt_tokens,
                         "cached_tokens": result.cached_tokens,
                         "completion_tokens": len(result.output_ids),
                         "finish_reason": result.finish_reason}
                if context.is_stopped():
                    self.engine.aborted.add(rid)
        except EngineError as exc:
            record["error"] = str(exc)
            self._emit(record)
            raise ValueError(str(exc)) from exc
        assert final is not None
        record.update(cached_tokens=final["cached_tokens"],
                      completion_tokens=final["completion_tokens"],
                      kv_published={"dynamo": dict(self.sink.counts),
                                    "zmq": self.zmq.published() if self.zmq else None})
        self._emit(record)
        self._snapshot()
        finish = "stop" if final["finish_reason"] == "stop" else (
            "length" if final["finish_reason"] == "length" else "cancelled")
        yield {
            "token_ids": pending or [], "index": 0, "finish_reason": finish,
            "completion_usage": {
                "prompt_tokens": final["prompt_tokens"],
                "completion_tokens": final["completion_tokens"],
                "total_tokens": final["prompt_tokens"] + final["completion_tokens"],
                "prompt_tokens_details": {"cached_tokens": final["cached_tokens"]},
            },
        }


def _context_of(context: Context) -> TraceContext | None:
    """The Dynamo request's trace (the frontend's), for the worker's vLLM-shaped span."""
    try:
        trace, span = context.trace_id, context.span_id
        return TraceContext(bytes.fromhex(trace), bytes.fromhex(span) if span else None) \
            if trace and len(trace) == 32 else None
    except (ValueError, AttributeError):
        return None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmlens.demo.dynamo_engine", description=__doc__)
    p.add_argument("--name", default="w1")
    p.add_argument("--family", choices=sorted(MODELS), default="qwen3-vl")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--namespace", default="dynamo")
    p.add_argument("--component", default="backend")
    p.add_argument("--endpoint", default="generate")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=4096)
    p.add_argument("--discovery-backend", choices=["file", "etcd"], default="file")
    p.add_argument("--event-plane", choices=["zmq", "nats"], default="zmq")
    p.add_argument("--max-model-len", type=int, default=65536)
    p.add_argument("--hash-seed", default="mmlens-demo")
    p.add_argument("--speed", type=float, default=1.0, help="latency divisor")
    p.add_argument("--count-drift", type=int, default=0,
                   help="add N to this worker's image-token count (estimator mismatch)")
    p.add_argument("--allowed-media-hosts", default="",
                   help="comma-separated host:port entries whose http(s) images may be "
                   "fetched (host:* allows every port of a host; default: none)")
    p.add_argument("--zmq-kv-port", type=int, default=0,
                   help="also publish vLLM-format ZMQ KV events on 127.0.0.1:PORT (0: off)")
    p.add_argument("--zmq-replay-port", type=int, default=0)
    p.add_argument("--kv-path", choices=["pad", "vllm-zmq"], default="pad",
                   help="pad: pad-value events through Dynamo's publisher (default); "
                        "vllm-zmq: raw vLLM-format ZMQ events that Dynamo normalizes itself")
    p.add_argument("--zmq-legacy-encoding", action="store_true",
                   help="ZMQ events as positional arrays (vLLM before PR #42892)")
    p.add_argument("--no-kv-events", action="store_true",
                   help="publish no KV events to Dynamo (for --no-router-kv-events runs)")
    p.add_argument("--otlp-traces-endpoint", default="",
                   help="export a vLLM-shaped llm_request span per request (OTLP/HTTP URL)")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    run(SimulatedVllmEngine, list(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
