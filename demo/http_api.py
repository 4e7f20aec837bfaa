"""The worker's OpenAI-compatible HTTP API (what SMG's HTTP mode talks to) plus `/metrics`.

HTTP mode is vLLM serving the raw OpenAI JSON: the worker renders the chat template,
tokenizes, and expands each image with its own processor, as in gRPC worker mode.
Also serves `/demo/requests` (what the worker received) and `/demo/kv/drop` (keep the next
N KV batches off the PUB socket, to force a gap that the replay socket then fills).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mmlens.demo.engine import EngineError, RequestResult
from mmlens.demo.expansion import PlaceholderMismatch
from mmlens.demo.media import MediaError
from mmlens.demo.otlp_export import parse_traceparent, traced_steps
from mmlens.demo.prefix_cache import MediaSpan
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

if TYPE_CHECKING:
    from mmlens.demo.worker import WorkerState


def error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None,
                                   "code": status}}, status_code=status)


def _image_url(part: dict[str, Any]) -> str | None:
    if part.get("type") not in (None, "image_url", "image"):
        return None
    value = part.get("image_url", part.get("image"))
    if isinstance(value, dict):
        value = value.get("url")
    return value if isinstance(value, str) else None


def _normalize(messages: Any) -> tuple[list[dict[str, Any]], list[str]]:
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    out, urls = [], []
    for msg in messages:
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise ValueError("each message needs a string 'role'")
        content = msg.get("content", "")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict):
                    raise ValueError("content parts must be objects")
                url = _image_url(part)
                if url is not None:
                    urls.append(url)
                    parts.append({"type": "image_url"})
                elif part.get("type") == "text" and isinstance(part.get("text"), str):
                    parts.append({"type": "text", "text": part["text"]})
                else:
                    raise ValueError(f"unsupported content part type {part.get('type')!r}")
            content = parts
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise ValueError("'content' must be a string or a list of parts")
        out.append({"role": msg["role"], "content": content})
    return out, urls


def _state(request: Request) -> WorkerState:
    return request.app.state.worker


async def _prepare(state: WorkerState, body: dict[str, Any],
                   ) -> tuple[list[int], list[MediaSpan], int] | Response:
    """The expanded prompt, the images' spans and max_tokens of a chat body, or a 404 for
    another model; ValueError (and the media and expansion errors) for a bad body."""
    messages, urls = _normalize(body.get("messages"))
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError("'max_tokens' must be a positive integer")
    model = body.get("model")
    if model not in (None, state.model.served_name):
        return error(404, f"The model `{model}` does not exist.", "NotFoundError")
    ids = state.render(messages)
    images = await asyncio.gather(*(state.decode(u) for u in urls))
    prompt, media = state.expander.expand(ids, images)
    return prompt, media, max_tokens


@dataclass(frozen=True)
class _Reply:
    """What every response body of one completion repeats."""

    rid: str
    created: int
    model: str
    include_usage: bool

    def chunk(self, delta: dict[str, Any], finish: str | None) -> bytes:
        data = {"id": self.rid, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [{"index": 0, "delta": delta,
                                                  "logprobs": None, "finish_reason": finish}]}
        if self.include_usage:
            data["usage"] = None
        return f"data: {json.dumps(data)}\n\n".encode()

    def usage_chunk(self, res: RequestResult) -> bytes:
        data = {"id": self.rid, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [], "usage": _usage(res)}
        return f"data: {json.dumps(data)}\n\n".encode()


Steps = AsyncIterator[tuple[list[int], RequestResult]]


async def chat(request: Request) -> Response:
    state = _state(request)
    state.last_receive = time.time()
    try:
        body = json.loads(await request.body())
        if not isinstance(body, dict):
            raise ValueError("request body must be a JSON object")
        prepared = await _prepare(state, body)
    except (ValueError, MediaError, PlaceholderMismatch) as exc:
        return error(400, str(exc))
    if isinstance(prepared, Response):
        return prepared
    prompt, media, max_tokens = prepared
    rid = request.headers.get("x-request-id") or f"chatcmpl-{uuid.uuid4().hex}"
    state.log_request("http", rid, prompt, media, None)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    reply = _Reply(rid, int(time.time()), state.model.served_name, include_usage)
    gen = traced_steps(state.engine.run(rid, prompt, media, max_tokens), state.tracer, rid,
                       state.model.served_name, max_tokens,
                       parse_traceparent(request.headers.get("traceparent")))
    if not body.get("stream"):
        return await _completion(state, gen, reply)
    try:
        first = await gen.__anext__()
    except EngineError as exc:
        await gen.aclose()
        return error(400, str(exc))
    return StreamingResponse(_sse(state, gen, first[1], reply), media_type="text/event-stream")


async def _completion(state: WorkerState, gen: Steps, reply: _Reply) -> Response:
    res = RequestResult()
    try:
        async with contextlib.aclosing(gen) as steps:
            async for _, step in steps:
                res = step
    except EngineError as exc:
        return error(400, str(exc))
    return JSONResponse({
        "id": reply.rid, "object": "chat.completion", "created": reply.created,
        "model": reply.model,
        "choices": [{"index": 0, "message": {"role": "assistant",
                                             "content": state.detokenize(res.output_ids)},
                     "logprobs": None, "finish_reason": res.finish_reason,
                     "stop_reason": None}],
        "usage": _usage(res),
    })


async def _sse(state: WorkerState, gen: Steps, res: RequestResult,
               reply: _Reply) -> AsyncIterator[bytes]:
    yield reply.chunk({"role": "assistant", "content": ""}, None)
    sent = ""
    async with contextlib.aclosing(gen) as steps:
        while True:
            text = state.detokenize(res.output_ids)
            if len(text) > len(sent):
                yield reply.chunk({"content": text[len(sent):]}, None)
                sent = text
            try:
                res = (await steps.__anext__())[1]
            except StopAsyncIteration:
                break
    yield reply.chunk({}, res.finish_reason)
    if reply.include_usage:
        yield reply.usage_chunk(res)
    yield b"data: [DONE]\n\n"


async def models(request: Request) -> Response:
    state = _state(request)
    m = state.model
    return JSONResponse({"object": "list", "data": [{
        "id": m.served_name, "object": "model", "created": int(state.started),
        "owned_by": "vllm", "root": m.served_name, "parent": None,
        "max_model_len": state.max_model_len}]})


async def health(_: Request) -> Response:
    return Response(status_code=200)


async def version(request: Request) -> Response:
    return JSONResponse({"version": _state(request).vllm_version})


async def loads(request: Request) -> Response:
    state = _state(request)
    e = state.engine
    cap = e.cache.num_blocks * e.cache.block_size
    return JSONResponse({
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "version": state.vllm_version, "dp_rank_count": 1,
        "loads": [{"dp_rank": 0, "num_running_reqs": e.running,
                   "num_waiting_reqs": e.waiting, "num_total_reqs": e.running + e.waiting,
                   "num_used_tokens": int(e.cache.usage() * cap),
                   "max_total_num_tokens": cap, "token_usage": e.cache.usage(),
                   "gen_throughput": state.gen_throughput(),
                   "cache_hit_rate": e.cache_hit_rate(), "utilization": e.cache.usage(),
                   "max_running_requests": state.max_num_seqs}]})


async def metrics(request: Request) -> Response:
    return PlainTextResponse(_state(request).metrics.render(),
                             media_type="text/plain; version=0.0.4; charset=utf-8")


async def requests_seen(request: Request) -> Response:
    last = int(request.query_params.get("last", "50"))
    return JSONResponse(list(_state(request).seen)[-last:])


async def drop_kv(request: Request) -> Response:
    publisher = _state(request).publisher
    publisher.drop_next += int(request.query_params.get("count", "1"))
    return JSONResponse({"drop_next": publisher.drop_next, "next_seq": publisher.next_seq})


async def kv_published(request: Request) -> Response:
    return JSONResponse(_state(request).publisher.published())


def build_app(state: WorkerState) -> Starlette:
    app = Starlette(routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models),
        Route("/health", health),
        Route("/version", version),
        Route("/v1/loads", loads),
        Route("/metrics", metrics),
        Route("/demo/requests", requests_seen),
        Route("/demo/kv/drop", drop_kv, methods=["POST"]),
        Route("/demo/kv/published", kv_published),
    ])
    app.state.worker = state
    return app


def _usage(res: RequestResult) -> dict[str, Any]:
    return {"prompt_tokens": res.prompt_tokens, "completion_tokens": len(res.output_ids),
            "total_tokens": res.prompt_tokens + len(res.output_ids),
            "prompt_tokens_details": {"cached_tokens": res.cached_tokens}}
