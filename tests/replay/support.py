"""Recorded requests as mmlens' own sender stores them (the trace sink's layout and image
identities), for the replay tests."""

from __future__ import annotations

from mmlens.collectors.trace_sink import SentRequest, TraceSink

from mmlens.layout.sent import ImagePart
from mmlens.layout.synthetic_images import synthetic_png
from mmlens.records import ImageInfo, RequestTrace
from mmlens.whatif.workload import RecordedRequest, workload

T0 = 1_800_000_000.0
RED = synthetic_png("solid", 640, 480, rgb=(200, 30, 30))
BLUE = synthetic_png("solid", 640, 480, rgb=(30, 30, 200))  # same size, other content
RED_HD = synthetic_png("solid", 1280, 720, rgb=(200, 30, 30))
DESCRIBE = "Describe this image in detail, please."
HAIKU = "Write a haiku about the sea, the wind and the long grey evening."
PLOT = "Summarize the plot of a film in which nothing happens for two hours."


def sent(rid: str, dt: float, text: str, images: list[bytes], *, cached: int = 0,
         keep_text: bool = False, status: int = 200, output: int = 12,
         stream: bool = False) -> RequestTrace:
    t = RequestTrace(request_id=rid, router="http://r", router_kind="smg",
                     model="Qwen/Qwen3-VL-2B-Instruct", ts=T0 + dt, stream=stream,
                     status=status, worker="grpc://w1", cached_tokens=cached,
                     completion_tokens=output, processing_mode="router")
    if status >= 400:
        t.error, t.error_code = "no worker", "no_worker"
    TraceSink(layout_model="qwen3-vl", keep_text=keep_text).describe(
        t, SentRequest(text, [ImagePart(d) for d in images]))
    layout = t.expected_layout
    assert layout is not None and layout.router_view is not None
    t.prompt_tokens = layout.router_view.token_count
    return t


def mixed_traces() -> list[RequestTrace]:
    """Repeats, a same-size different image, text-only requests, another size; then what a
    replay cannot rebuild: a failed request, an image of unknown size, a log-only record."""
    unsized = RequestTrace(request_id="unsized", router="http://r", router_kind="smg",
                           model="m", ts=T0 + 7, stream=False, status=200, prompt_tokens=90,
                           images=[ImageInfo("http", identities={"dynamo_mm_hash_url": "ab"})])
    logged = RequestTrace(request_id="logged", router="http://r", router_kind="smg",
                          model="m", ts=T0 + 8, stream=None, status=200, prompt_tokens=None,
                          origin="observed", provenance={"worker": "router_log"})
    return [
        sent("red", 0.0, DESCRIBE, [RED]),
        sent("red-again", 1.0, DESCRIBE, [RED], cached=304),
        sent("blue", 2.0, DESCRIBE, [BLUE]),
        sent("haiku", 3.0, HAIKU, []),
        sent("plot", 3.5, PLOT, [], stream=True),
        sent("haiku-again", 4.0, HAIKU, [], cached=16),
        sent("red-hd", 5.0, DESCRIBE, [RED_HD]),
        sent("failed", 6.0, DESCRIBE, [RED], status=503),
        unsized, logged,
    ]


def recorded(traces: list[RequestTrace]) -> list[RecordedRequest]:
    return workload(traces, {})
