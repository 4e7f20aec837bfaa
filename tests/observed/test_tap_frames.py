"""The proxy's frames to its recorder: every exchange comes out as it went in, whatever the
pipe does to them (reads that cut frames anywhere, a frame larger than the reader's buffer, a
pipe too full to take a write), and a frame cut off by the writer's death is dropped."""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import replace

from mmlens.collectors.tap_frames import (
    EXCHANGE,
    HEALTH,
    STOP,
    FrameReader,
    PipeWriter,
    exchange_frame,
    health_frame,
    stop_frame,
)

from mmlens.ingest.tap_parse import Exchange
from mmlens.records import CollectorHealth


def exchanges() -> list[Exchange]:
    sse = Exchange(1.5, 2.5, b'{"model":"m","stream":true}', "rid-1", 200,
                   {"content-type": "text/event-stream"}, sse=True)
    for i in range(40):
        sse.add(0.001 * i, b"data: {\"i\": %d}\n\n" % i, 100, 120)
    big = Exchange(3.0, 4.0, b"", None, 200, {"x": "y"},
                   body_parts=[os.urandom(1 << 20) for _ in range(3)])  # as the proxy holds it
    big.add(0.01, b'{"id":"c"}', 1 << 20, 0)
    over = Exchange(5.0, 6.0, b"", None, 502, {})
    over.add(0.1, b"x" * 50, 10, 0)  # over the cap: no chunks, overflow
    over.latency_s, over.cut = 0.25, "upstream_broken"
    return [sse, big, over]


def joined(ex: Exchange) -> Exchange:
    return replace(ex, body=ex.request_body(), body_parts=[])


def test_exchanges_come_out_as_they_went_in_through_a_full_pipe() -> None:
    sent = exchanges()
    row = CollectorHealth("tap", "u", counters={"requests": 3.0})
    r, w = os.pipe()
    broken: list[int] = []
    writer = PipeWriter(w, lambda: broken.append(1))
    got: list[tuple[int, object]] = []

    def read_all() -> None:
        reader = FrameReader(r)
        while (frames := reader.read()) is not None:
            got.extend(frames)

    async def send() -> None:  # on a loop: the 3 MB body does not fit the pipe at once
        for ex in sent:
            writer.send(exchange_frame(ex))
        writer.send(health_frame(row))
        assert writer.pending() > 0  # nobody reads yet: the rest waits, the loop goes on
        reading.start()
        while writer.pending():
            await asyncio.sleep(0.01)

    reading = threading.Thread(target=read_all)
    asyncio.run(send())
    writer.close(stop_frame())
    reading.join(10)
    os.close(r)
    assert [k for k, _ in got] == [EXCHANGE] * 3 + [HEALTH, STOP] and not broken
    assert [item for _, item in got[:3]] == [joined(ex) for ex in sent]
    assert got[3][1] == row


def test_a_frame_cut_off_by_the_writers_death_is_dropped() -> None:
    first, second = exchanges()[0], exchanges()[2]
    data = b"".join([*exchange_frame(first), *exchange_frame(second)])
    r, w = os.pipe()
    os.write(w, data[:-7])
    os.close(w)
    reader = FrameReader(r)
    got = []
    while (frames := reader.read()) is not None:
        got.extend(frames)
    os.close(r)
    assert got == [(EXCHANGE, first)]


def test_the_writer_says_once_when_the_reader_is_gone() -> None:
    r, w = os.pipe()
    os.close(r)
    broken: list[int] = []
    writer = PipeWriter(w, lambda: broken.append(1))
    writer.send(exchange_frame(exchanges()[2]))
    writer.send(exchange_frame(exchanges()[2]))
    assert broken == [1] and writer.pending() == 0
    writer.close(stop_frame())
