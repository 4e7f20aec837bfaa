"""Helpers for the demo tests: free ports, request bodies, and readers that are independent
of the worker's own code (Prometheus text via prometheus_client's parser, KV events via the
`msgpack` package rather than the worker's msgspec structs)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgpack
import zmq
from mmlens.collectors.traces import solid_png
from mmlens.demo.cluster import Cluster, ClusterConfig
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from mmlens.layout.imageinfo import to_data_url
from tests.live_support import free_port_base, started, zmq_connect

TEXT = "Describe this image in detail please."


@contextlib.contextmanager
def running_cluster(**kwargs: Any) -> Iterator[Cluster]:
    kwargs.setdefault("ready_timeout", 40.0)
    span = 10 + 10 * kwargs.get("workers", 2) + 10
    with started(lambda: Cluster(ClusterConfig(port_base=free_port_base(span), **kwargs))) as c:
        yield c


def png_data_url(width: int, height: int, color: tuple[int, int, int]) -> str:
    return to_data_url(solid_png(width, height, color), "PNG")


def noisy_png_data_url(width: int, height: int) -> str:
    buf = io.BytesIO()
    Image.frombytes("RGB", (width, height), os.urandom(width * height * 3)).save(buf, "PNG")
    return to_data_url(buf.getvalue(), "PNG")


def image_messages(url: str, text: str = TEXT, system: str | None = None) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}]
    if system:
        msgs.insert(0, {"role": "system", "content": system})
    return msgs


@dataclass
class ChatResult:
    status: int
    worker: str | None
    prompt_tokens: int
    cached_tokens: int
    trace: dict[str, Any] | None
    body: dict[str, Any]
    headers: httpx.Headers

    @property
    def prediction(self) -> dict[str, Any]:
        assert self.trace is not None, "no x-smg-cache-trace header"
        return self.trace["selections"][0]["prediction"]


def chat(router: str, model: str, messages: list[dict[str, Any]], max_tokens: int = 4,
         **extra: Any) -> ChatResult:
    r = httpx.post(f"{router}/v1/chat/completions", timeout=120,
                   json={"model": model, "messages": messages, "max_tokens": max_tokens, **extra})
    body = r.json()
    usage = body.get("usage") or {}
    trace = r.headers.get("x-smg-cache-trace")
    return ChatResult(
        status=r.status_code,
        worker=r.headers.get("x-smg-routed-worker-id"),
        prompt_tokens=usage.get("prompt_tokens", 0),
        # SMG omits prompt_tokens_details when cached_tokens is 0.
        cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
        trace=json.loads(trace) if trace else None,
        body=body,
        headers=r.headers,
    )


def metric_samples(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    text = httpx.get(url, timeout=10).text
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out.append((dict(s.labels), float(s.value)))
    return out


def metric_value(url: str, name: str, **labels: str) -> float:
    return sum(v for lab, v in metric_samples(url, name)
               if all(lab.get(k) == val for k, val in labels.items()))


def worker_http(info: dict[str, Any], url: str) -> str:
    """The HTTP base of the worker SMG names by its (grpc:// or http://) URL."""
    return next(w["http"] for w in info["workers"] if url in (w["url"], w["http"]))


def worker_requests(worker_http: str, last: int = 50) -> list[dict[str, Any]]:
    return httpx.get(f"{worker_http}/demo/requests?last={last}", timeout=10).json()


# --- KV events: an independent decoder (msgpack package, hand normalization) -------------

STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                 "kv_cache_spec_sliding_window"]
REMOVED_FIELDS = ["block_hashes", "medium", "group_idx"]


def decode_event(raw: Any) -> dict[str, Any]:
    """One event, array-encoded (tag first) or map-encoded (tag under "type")."""
    if isinstance(raw, dict):
        return dict(raw)
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag, values = raw[0], raw[1:]
        fields = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS}.get(tag, [])
        return {"type": tag, **dict(zip(fields, values, strict=False))}
    raise ValueError(f"not a KV event: {raw!r}")


def decode_payload(payload: bytes) -> tuple[float, list[dict[str, Any]], int | None]:
    obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if isinstance(obj, dict):
        return obj["ts"], [decode_event(e) for e in obj["events"]], obj.get(
            "data_parallel_rank")
    ts, events, *rest = obj
    return ts, [decode_event(e) for e in events], rest[0] if rest else None


class KvSubscriber:
    """SUB socket on a worker's PUB endpoint plus DEALER replay requests."""

    def __init__(self, endpoint: str, replay: str, topic: str = "kv-events") -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt_string(zmq.SUBSCRIBE, topic)
        zmq_connect(self.sub, endpoint)
        self.replay_endpoint = replay
        self.topic = topic

    def recv(self, timeout: float = 3.0) -> list[tuple[int, bytes]]:
        """All (seq, payload) messages arriving within `timeout` after the first one."""
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sub.poll(100):
                topic, seq, payload = self.sub.recv_multipart()
                assert topic == self.topic.encode()
                out.append((int.from_bytes(seq, "big"), payload))
                deadline = max(deadline, time.monotonic() + 0.5)
            elif out:
                break
        return out

    def replay(self, start: int, timeout: float = 3.0) -> list[tuple[int, bytes]]:
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            out = []
            while dealer.poll(int(timeout * 1000)):
                _, seq, payload = dealer.recv_multipart()
                if seq == (-1).to_bytes(8, "big", signed=True):
                    return out
                out.append((int.from_bytes(seq, "big"), payload))
            raise TimeoutError("replay did not end with the END marker")
        finally:
            dealer.close()

    def close(self) -> None:
        self.sub.close()
        self.ctx.term()
