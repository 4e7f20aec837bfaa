"""Recorded requests for the what-if tests, made the way the store gets them: each prompt
described by the trace sink with the real Qwen3-VL layout (keys per block, spans, image
identities), then read back as the workload record."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from mmlens.collectors.trace_sink import SentRequest, TraceSink

from mmlens.layout.sent import ImagePart
from mmlens.layout.synthetic_images import synthetic_png
from mmlens.records import RequestTrace
from mmlens.whatif.workload import RecordedRequest, recorded

TEXT = "Describe this image in detail please."
T0 = 1_800_000_000.0
W1, W2 = "grpc://127.0.0.1:50051", "grpc://127.0.0.1:50052"


@cache
def png(kind: str, width: int, height: int, seed: int = 0) -> bytes:
    """``kind`` solid/noise/gradient; ``seed`` changes the colour (another image)."""
    return synthetic_png(kind, width, height, seed=seed,
                         rgb=((37 * seed) % 256, (91 * seed + 30) % 256, 200))


@cache
def layout_trace(text: str, images: tuple[bytes, ...]) -> RequestTrace:
    t = RequestTrace("x", "http://127.0.0.1:30000", "smg", "Qwen/Qwen3-VL-2B-Instruct", 0.0,
                     False)
    TraceSink(layout_model="qwen3-vl").describe(t, SentRequest(text, [ImagePart(d)
                                                                      for d in images]))
    return t


def request(rid: str, ts: float, images: Sequence[bytes] = (), text: str = TEXT, *,
            worker: str | None = None, cached: int | None = None, latency: float = 0.2,
            ttft: float = 0.05, output: int = 8, kind: str = "smg",
            mode: str | None = "router") -> RecordedRequest:
    base = layout_trace(text, tuple(images))
    lay = base.expected_layout
    assert lay is not None and lay.ok
    t = RequestTrace(rid, base.router, kind, base.model, ts, False, images=base.images,
                     status=200, worker=worker, prompt_tokens=lay.engine_prompt_tokens,
                     cached_tokens=cached, completion_tokens=output, latency_s=latency,
                     ttft_s=ttft, processing_mode=mode, expected_layout=lay)
    return recorded(t)
