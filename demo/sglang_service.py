"""SGLang's gRPC scheduler service (`sglang.grpc.scheduler.SglangScheduler` of smg-grpc-proto).

SMG sends `tokenized.input_ids` with each image's placeholder run already expanded and the
image's pixels in `mm_inputs`; like SGLang, the worker keys each image by a hash of its data
and overwrites its run with the pad value `1_000_000 + (hash % 2^30)`, so different images
never share a prefix-cache page and no extra keys are needed. KV events: one per page.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import struct_pb2
from mmlens.demo.engine import EngineError
from mmlens.demo.grpc_service import (
    checked_ids,
    engine_load,
    flush_cache,
    model_info,
    scheduler_load,
    stream_kv_events,
)
from mmlens.demo.kv_publisher import PublishedBatch
from mmlens.demo.kv_wire import signed64
from mmlens.demo.prefix_cache import Event, MediaSpan, RemovedBlocks, StoredBlocks
from smg_grpc_proto.generated import common_pb2, sglang_scheduler_pb2, sglang_scheduler_pb2_grpc

if TYPE_CHECKING:
    from mmlens.demo.worker import WorkerState

MM_PAD_SHIFT_VALUE = 1_000_000


def sglang_pad_value(data: bytes) -> int:
    """SGLang's pad value for an item: its data hash (first 8 bytes of sha256, big-endian)
    modulo 2^30, shifted past the vocabulary."""
    digest = hashlib.sha256(data).digest()
    return MM_PAD_SHIFT_VALUE + int.from_bytes(digest[:8], "big") % (1 << 30)


def _item_data(mm: Any, i: int, n: int) -> bytes:
    """The bytes SGLang would hash for image i: its raw data when sent, else its share of the
    preprocessed pixel tensor."""
    if i < len(mm.image_data):
        return bytes(mm.image_data[i])
    data = bytes(mm.pixel_values.data)
    step = len(data) // max(n, 1)
    return data[i * step:(i + 1) * step] if step else data + i.to_bytes(4, "little")


def pad_images(ids: list[int], mm: Any) -> tuple[list[int], list[MediaSpan]]:
    """`ids` with each placeholder run replaced by its image's pad value."""
    out = list(ids)
    spans: list[MediaSpan] = []
    n = len(mm.mm_placeholders)
    for i, ph in enumerate(mm.mm_placeholders):
        if ph.offset + ph.length > len(out):
            raise EngineError("mm placeholder range outside the prompt")
        pad = sglang_pad_value(_item_data(mm, i, n))
        out[ph.offset:ph.offset + ph.length] = [pad] * ph.length
        spans.append(MediaSpan(f"sglang-pad-{pad}", ph.offset, ph.length))
    return out, spans


def proto_pages(event: Event, next_id: Any) -> list[common_pb2.KvCacheEvent]:
    """One streamed event per page, as SGLang's servicer sends them."""
    if isinstance(event, StoredBlocks):
        bs, out, parent = event.block_size, [], event.parent_block_hash
        for i, h in enumerate(event.block_hashes):
            stored = common_pb2.KvBlocksStored(
                blocks=[common_pb2.KvBlock(block_hash=signed64(h), block_size=bs,
                                           token_ids=event.token_ids[i * bs:(i + 1) * bs])],
                medium="GPU")
            if parent is not None:
                stored.parent_block_hash = signed64(parent)
            out.append(common_pb2.KvCacheEvent(event_id=next_id(), stored=stored))
            parent = h
        return out
    if isinstance(event, RemovedBlocks):
        return [common_pb2.KvCacheEvent(event_id=next_id(), removed=common_pb2.KvBlocksRemoved(
            block_hashes=[signed64(h)], medium="GPU")) for h in event.block_hashes]
    return [common_pb2.KvCacheEvent(event_id=next_id(), cleared=common_pb2.KvCacheCleared())]


class SglangSchedulerService(sglang_scheduler_pb2_grpc.SglangSchedulerServicer):
    def __init__(self, state: WorkerState) -> None:
        self.s = state
        self._event_id = 0
        self._sample = 0

    def _next_id(self) -> int:
        self._event_id += 1
        return self._event_id

    def engine_load(self, load_only: bool) -> common_pb2.EngineLoad:
        self._sample += 1
        return engine_load(self.s, self._sample, load_only)

    def proto_batch(self, b: PublishedBatch) -> common_pb2.KvEventBatch:
        events = [p for ev in b.events for p in proto_pages(ev, self._next_id)]
        return common_pb2.KvEventBatch(sequence_number=b.seq + 1, timestamp=b.ts,
                                       events=events, dp_rank=0, load=self.engine_load(False))

    async def SubscribeKvEvents(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for batch in stream_kv_events(self, request, context):
            yield batch

    async def HealthCheck(self, request: Any, context: Any) -> Any:
        return sglang_scheduler_pb2.HealthCheckResponse(healthy=True, message="OK")

    async def GetModelInfo(self, request: Any, context: Any) -> Any:
        return model_info(sglang_scheduler_pb2.GetModelInfoResponse, self.s)

    async def GetServerInfo(self, request: Any, context: Any) -> Any:
        s = self.s
        args = struct_pb2.Struct()
        args.update({"page_size": s.engine.cache.block_size, "model_path": s.model.served_name,
                     "enable_metrics": True, "kv_events_config": "zmq"})
        return sglang_scheduler_pb2.GetServerInfoResponse(
            server_args=args, active_requests=s.engine.running, is_paused=False,
            last_receive_timestamp=s.last_receive, uptime_seconds=time.time() - s.started,
            sglang_version="0.5.10", server_type="grpc",
            max_total_num_tokens=s.engine.cache.num_blocks * s.engine.cache.block_size)

    async def GetLoads(self, request: Any, context: Any) -> Any:
        load = scheduler_load(sglang_scheduler_pb2.SchedulerLoad, self.s)
        return sglang_scheduler_pb2.GetLoadsResponse(
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), version="0.5.10",
            dp_rank_count=1, loads=[load])

    async def Abort(self, request: Any, context: Any) -> Any:
        self.s.engine.abort([request.request_id])
        return sglang_scheduler_pb2.AbortResponse(success=True)

    async def FlushCache(self, request: Any, context: Any) -> Any:
        return await flush_cache(self.s)

    def _prompt(self, request: Any) -> tuple[list[int], list[MediaSpan]]:
        ids = checked_ids(request, self.s.model.config["vocab_size"])
        if request.HasField("mm_inputs") and request.mm_inputs.mm_placeholders:
            return pad_images(ids, request.mm_inputs)
        return ids, []

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[Any]:
        s = self.s
        s.last_receive = time.time()
        try:
            prompt, media = self._prompt(request)
        except EngineError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        sp = request.sampling_params
        max_tokens = sp.max_new_tokens if sp.HasField("max_new_tokens") else 16
        s.log_request("grpc", request.request_id, prompt, media, None)
        if request.HasField("mm_inputs"):  # what the router sent, for tests and debugging
            mm = request.mm_inputs
            s.seen[-1].update(mm_fields=sorted(f.name for f, _ in mm.ListFields()),
                              im_token_id=mm.im_token_id,
                              pad_values=sorted({t for t in prompt if t >= MM_PAD_SHIFT_VALUE}))
        rid = request.request_id
        try:
            async with contextlib.aclosing(s.engine.run(rid, prompt, media, max_tokens)) as steps:
                async for new, res in steps:
                    if request.stream and new:
                        yield sglang_scheduler_pb2.GenerateResponse(
                            request_id=rid, chunk=sglang_scheduler_pb2.GenerateStreamChunk(
                                token_ids=new, prompt_tokens=res.prompt_tokens,
                                completion_tokens=len(res.output_ids),
                                cached_tokens=res.cached_tokens))
            yield sglang_scheduler_pb2.GenerateResponse(
                request_id=rid, complete=sglang_scheduler_pb2.GenerateComplete(
                    output_ids=[] if request.stream else res.output_ids,
                    finish_reason=res.finish_reason, prompt_tokens=res.prompt_tokens,
                    completion_tokens=len(res.output_ids), cached_tokens=res.cached_tokens))
        except EngineError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


def pad_ids(mm: Any) -> Sequence[int]:
    """The pad values a request's images get (tests compare them with the KV events)."""
    n = len(mm.mm_placeholders)
    return [sglang_pad_value(_item_data(mm, i, n)) for i in range(n)]

