"""The vLLM gRPC engine service (`vllm.grpc.engine.VllmEngine` of smg-grpc-proto).

Router mode: `tokenized.input_ids` are already expanded and `mm_inputs` carries SMG's hashes
and placeholder ranges, which become the blocks' extra keys. Worker mode (`media_refs`): the
worker fetches, decodes and expands the images itself, with its own identifiers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
from mmlens.demo.engine import EngineError
from mmlens.demo.expansion import PlaceholderMismatch
from mmlens.demo.kv_publisher import PublishedBatch
from mmlens.demo.media import MediaError
from mmlens.demo.otlp_export import parse_traceparent, traced_steps
from mmlens.demo.prefix_cache import AllCleared, Event, MediaSpan, RemovedBlocks, StoredBlocks
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc

if TYPE_CHECKING:
    from mmlens.demo.worker import WorkerState

HEARTBEAT_S = 1.0


def _i64(h: int) -> int:
    return h - (1 << 64) if h >= (1 << 63) else h


def _proto_event(event: Event, event_id: int) -> common_pb2.KvCacheEvent:
    if isinstance(event, StoredBlocks):
        bs = event.block_size
        blocks = []
        for i, h in enumerate(event.block_hashes):
            extras = [
                common_pb2.KvBlockExtraKey(
                    multimodal=common_pb2.KvMultimodalKey(identifier=ident, offset=off))
                for ident, off in (event.extra_keys[i] or [])
            ]
            blocks.append(common_pb2.KvBlock(block_hash=_i64(h),
                                             token_ids=event.token_ids[i * bs : (i + 1) * bs],
                                             block_size=bs, extra_keys=extras))
        stored = common_pb2.KvBlocksStored(blocks=blocks, medium="GPU", group_idx=0,
                                           kv_cache_spec_kind="full_attention")
        if event.parent_block_hash is not None:
            stored.parent_block_hash = _i64(event.parent_block_hash)
        return common_pb2.KvCacheEvent(event_id=event_id, stored=stored)
    if isinstance(event, RemovedBlocks):
        return common_pb2.KvCacheEvent(event_id=event_id, removed=common_pb2.KvBlocksRemoved(
            block_hashes=[_i64(h) for h in event.block_hashes], medium="GPU", group_idx=0))
    if isinstance(event, AllCleared):
        return common_pb2.KvCacheEvent(event_id=event_id, cleared=common_pb2.KvCacheCleared())
    raise TypeError(event)


def checked_ids(request: Any, vocab: int) -> list[int]:
    """The request's token ids, refused when one lies outside the vocabulary."""
    ids = list(request.tokenized.input_ids)
    bad = [t for t in ids if t >= vocab]
    if bad:
        raise EngineError(f"token id {bad[0]} out of vocabulary (size {vocab})")
    return ids


def engine_load(state: WorkerState, sample: int, load_only: bool) -> common_pb2.EngineLoad:
    """The load record both engines' KV-event batches carry (``sample`` counts them)."""
    e = state.engine
    capacity = e.cache.num_blocks * e.cache.block_size
    return common_pb2.EngineLoad(
        running_requests=e.running, waiting_requests=e.waiting,
        token_usage=e.cache.usage(), gen_throughput=state.gen_throughput(),
        max_running_requests=state.max_num_seqs, sample=sample,
        load_only=load_only, cache_hit_rate=e.cache_hit_rate(),
        num_used_tokens=int(e.cache.usage() * capacity), max_total_num_tokens=capacity)


def scheduler_load(load_type: Any, state: WorkerState) -> Any:
    """GetLoads' one rank as ``load_type``: vLLM's and SGLang's SchedulerLoad name their
    fields alike."""
    e = state.engine
    capacity = e.cache.num_blocks * e.cache.block_size
    return load_type(
        dp_rank=0, num_running_reqs=e.running, num_waiting_reqs=e.waiting,
        num_total_reqs=e.running + e.waiting,
        num_used_tokens=int(e.cache.usage() * capacity), max_total_num_tokens=capacity,
        token_usage=e.cache.usage(), gen_throughput=state.gen_throughput(),
        cache_hit_rate=e.cache_hit_rate(), utilization=e.cache.usage(),
        max_running_requests=state.max_num_seqs)


def model_info(response_type: Any, state: WorkerState) -> Any:
    """GetModelInfo's answer as ``response_type``: vLLM's and SGLang's name their fields
    alike."""
    m, cfg = state.model, state.model.config
    return response_type(
        model_path=m.served_name, tokenizer_path=str(state.model_dir), is_generation=True,
        served_model_name=m.served_name, max_context_length=state.max_model_len,
        vocab_size=cfg["vocab_size"], supports_vision=True, model_type=m.model_type,
        eos_token_ids=[cfg["eos_token_id"]],
        pad_token_id=cfg.get("pad_token_id", cfg["eos_token_id"]),
        bos_token_id=cfg.get("bos_token_id", 0), max_req_input_len=state.max_model_len,
        architectures=cfg["architectures"])


async def flush_cache(state: WorkerState) -> common_pb2.FlushCacheResponse:
    events: list[Event] = []
    state.engine.cache.reset(events)
    await state.publisher.publish(events)
    return common_pb2.FlushCacheResponse(success=True, message="flushed")


async def stream_kv_events(service: Any, request: Any, context: Any) -> AsyncIterator[Any]:
    """The SubscribeKvEvents stream both engine services serve: ``service`` supplies
    ``engine_load(load_only)`` and ``proto_batch(published)``."""
    # SMG vetoes a worker whose stream does not answer within 2 s: headers go out at once.
    await context.send_initial_metadata(())
    pub = service.s.publisher
    queue: asyncio.Queue[PublishedBatch | None] = asyncio.Queue()
    pub.subscribers.add(queue)
    last = 0
    try:
        # The stream's first record: the load right away, before any batch.
        yield common_pb2.KvEventBatch(sequence_number=0, timestamp=time.time(), dp_rank=0,
                                      load=service.engine_load(True))
        if request.start_sequence_number > 0:
            for b in pub.since(request.start_sequence_number - 1):
                yield service.proto_batch(b)
                last = b.seq + 1
        while True:
            try:
                items = [await asyncio.wait_for(queue.get(), HEARTBEAT_S)]
            except TimeoutError:
                items = [None]  # idle: heartbeat
            while not queue.empty():
                items.append(queue.get_nowait())
            for b in items:
                if b is not None and b.seq + 1 > last:
                    yield service.proto_batch(b)
                    last = b.seq + 1
            if None in items:
                # One load-only record for a heartbeat or for load changes without a KV
                # event (admission, completion), coalesced and sent after the batches.
                yield common_pb2.KvEventBatch(sequence_number=last, timestamp=time.time(),
                                              dp_rank=0, load=service.engine_load(True))
    finally:
        pub.subscribers.discard(queue)


class VllmEngineService(vllm_engine_pb2_grpc.VllmEngineServicer):
    def __init__(self, state: WorkerState) -> None:
        self.s = state
        self._event_id = 0
        self._load_sample = 0

    # -- loads ---------------------------------------------------------------------------
    def engine_load(self, load_only: bool) -> common_pb2.EngineLoad:
        self._load_sample += 1
        load = engine_load(self.s, self._load_sample, load_only)
        load.waiting_uncached_tokens = 0  # vLLM sets it; SGLang leaves it absent
        return load

    def proto_batch(self, b: PublishedBatch) -> common_pb2.KvEventBatch:
        events = []
        for ev in b.events:
            self._event_id += 1
            events.append(_proto_event(ev, self._event_id))
        return common_pb2.KvEventBatch(sequence_number=b.seq + 1, timestamp=b.ts,
                                       events=events, dp_rank=0,
                                       load=self.engine_load(False))

    async def SubscribeKvEvents(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for batch in stream_kv_events(self, request, context):
            yield batch

    async def GetLoads(self, request: Any, context: Any) -> Any:
        load = scheduler_load(vllm_engine_pb2.SchedulerLoad, self.s)
        return vllm_engine_pb2.GetLoadsResponse(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            version=self.s.vllm_version, dp_rank_count=1, loads=[load])

    # -- info ----------------------------------------------------------------------------
    async def HealthCheck(self, request: Any, context: Any) -> Any:
        return vllm_engine_pb2.HealthCheckResponse(healthy=True, message="Health check passed")

    async def GetModelInfo(self, request: Any, context: Any) -> Any:
        return model_info(vllm_engine_pb2.GetModelInfoResponse, self.s)

    async def GetServerInfo(self, request: Any, context: Any) -> Any:
        s = self.s
        info = vllm_engine_pb2.GetServerInfoResponse(
            active_requests=s.engine.running, is_paused=False,
            last_receive_timestamp=s.last_receive, uptime_seconds=time.time() - s.started,
            server_type="vllm-grpc", data_parallel_size=1, kv_cache_dtype="auto",
            block_size=s.engine.cache.block_size, model_dtype="torch.bfloat16",
            max_num_seqs=s.max_num_seqs, mm_item_limits="image=10",
            multimodal_encoder_dtype="bfloat16")
        if s.mm_processor:
            info.mm_processor = s.mm_processor
            info.mm_media_ref_schemes = "http,https,data"
            info.mm_processor_source = "flag"
        return info

    async def Abort(self, request: Any, context: Any) -> Any:
        self.s.engine.abort(list(request.request_ids))
        return vllm_engine_pb2.AbortResponse()

    async def FlushCache(self, request: Any, context: Any) -> Any:
        return await flush_cache(self.s)

    # -- generate ------------------------------------------------------------------------
    async def _prompt(self, request: Any) -> tuple[list[int], list[MediaSpan]]:
        if request.WhichOneof("input") != "tokenized":
            raise EngineError("this engine accepts tokenized input only")
        ids = checked_ids(request, self.s.model.config["vocab_size"])
        if request.HasField("media_refs") and request.media_refs.items:
            if request.HasField("mm_inputs"):
                raise EngineError("media_refs and mm_inputs are mutually exclusive")
            if not self.s.mm_processor:
                raise EngineError("this worker does not accept media_refs (mm_processor off)")
            urls = [item.url for item in request.media_refs.items]
            images = await asyncio.gather(*(self.s.decode(u) for u in urls))
            return self.s.expander.expand(ids, images)
        media: list[MediaSpan] = []
        for mm in [request.mm_inputs, *request.extra_mm_inputs] if request.HasField(
                "mm_inputs") else []:
            for i, ph in enumerate(mm.mm_placeholders):
                ident = mm.mm_hashes[i] if i < len(mm.mm_hashes) else f"anon-{ph.offset}"
                if ph.offset + ph.length > len(ids):
                    raise EngineError("mm placeholder range outside the prompt")
                media.append(MediaSpan(ident, ph.offset, ph.length))
        return ids, media

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[Any]:
        s = self.s
        s.last_receive = time.time()
        try:
            prompt, media = await self._prompt(request)
        except (EngineError, MediaError, PlaceholderMismatch) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        sp = request.sampling_params
        max_tokens = sp.max_tokens if sp.HasField("max_tokens") else 16
        metadata = {k: v for k, v in context.invocation_metadata() or ()
                    if isinstance(v, str)}
        s.log_request("grpc", request.request_id, prompt, media, request, metadata=metadata)
        try:
            # aclosing: a cancelled RPC (client gone) releases the request's blocks at once.
            async with contextlib.aclosing(traced_steps(
                    s.engine.run(request.request_id, prompt, media, max_tokens), s.tracer,
                    request.request_id, s.model.served_name, max_tokens,
                    parse_traceparent(metadata.get("traceparent")))) as steps:
                async for new, res in steps:
                    if not (request.stream and new):
                        continue
                    yield vllm_engine_pb2.GenerateResponse(
                        chunk=vllm_engine_pb2.GenerateStreamChunk(
                            token_ids=new, prompt_tokens=res.prompt_tokens,
                            completion_tokens=len(res.output_ids),
                            cached_tokens=res.cached_tokens))
            yield vllm_engine_pb2.GenerateResponse(complete=vllm_engine_pb2.GenerateComplete(
                output_ids=[] if request.stream else res.output_ids,
                finish_reason=res.finish_reason, prompt_tokens=res.prompt_tokens,
                completion_tokens=len(res.output_ids), cached_tokens=res.cached_tokens))
        except EngineError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


async def start_grpc_server(state: WorkerState, host: str, port: int) -> grpc.aio.Server:
    opts = [("grpc.max_receive_message_length", 1 << 30),
            ("grpc.max_send_message_length", 64 << 20)]
    server = grpc.aio.server(options=opts)
    if state.engine_kind == "sglang":
        from mmlens.demo.sglang_service import SglangSchedulerService
        from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc

        sglang_scheduler_pb2_grpc.add_SglangSchedulerServicer_to_server(
            SglangSchedulerService(state), server)
    else:
        vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(VllmEngineService(state), server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot bind gRPC port {port}")
    await server.start()
    return server


async def stop_grpc_server(server: grpc.aio.Server) -> None:
    with contextlib.suppress(Exception):
        await server.stop(grace=0.5)
