"""The proxy's frames to its recorder: every exchange comes out as it went in, whatever the
pipe does to them (reads that cut frames anywhere, a frame larger than the reader's buffer, a
pipe too full to take a write), and a frame cut off by the writer's death is dropped; a large
exchange's data goes through the shared ring while it has room, and through the pipe when
it has none."""

from __future__ import annotations

import asyncio
import os
import struct
import threading
from dataclasses import replace

from mmlens.collectors.tap_frames import (
    EXCHANGE,
    HEALTH,
    RING,
    STOP,
    FrameReader,
    PipeWriter,
    Ring,
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


def rings(size: int) -> tuple[Ring, Ring]:
    """The proxy's and the recorder's ends of one ring."""
    fd = Ring.memory(size)
    assert fd is not None
    freed = [0]  # a plain list stands in for the shared int64
    proxy, recorder = Ring(fd, size, freed), Ring(fd, size, freed)
    os.close(fd)
    return proxy, recorder


def big(i: int, n: int = 300_000) -> Exchange:
    ex = Exchange(float(i), 0.0, b"", f"r{i}", 200, {},
                  body_parts=[bytes([i]) * (n // 2), os.urandom(n - n // 2)])
    ex.add(0.01, b'{"id":"%d"}' % i, 1 << 20, 0)
    return ex


def test_large_exchanges_go_through_the_ring_and_the_pipe_when_it_is_full() -> None:
    proxy, recorder = rings(1 << 20)  # room for three 300 KB exchanges, not four
    sent = [big(i) for i in range(5)]
    frames = [exchange_frame(ex, proxy) for ex in sent]
    kinds = [struct.unpack_from("<B", f[0])[0] for f in frames]
    assert kinds == [RING, RING, RING, EXCHANGE, EXCHANGE]  # nothing dropped
    assert sum(map(len, frames[0])) < 500  # the pipe carries where the data is, not the data
    r, w = os.pipe()

    def write() -> None:  # (more than a pipe holds)
        for f in frames:
            os.writev(w, f)
        os.close(w)

    writing = threading.Thread(target=write)
    writing.start()
    reader = FrameReader(r, recorder)
    got: list[tuple[int, object]] = []
    while len(got) < 5:  # (a borrowed body is good until the next read)
        got += [(k, replace(ex, body=bytes(ex.body))) for k, ex in reader.read(borrow=True) or []]
    writing.join(10)
    assert [k for k, _ in got] == [EXCHANGE] * 5
    assert [ex for _, ex in got] == [joined(ex) for ex in sent]
    reader.release()
    assert proxy.freed[0] == proxy.head  # all parsed: the ring is empty again
    assert reader.read() is None
    os.close(r)


def test_an_empty_ring_starts_over_and_data_never_wraps() -> None:
    proxy, recorder = rings(1 << 20)
    first = proxy.place([b"a" * 400_000], 400_000)
    assert first == 0
    second = proxy.place([b"b" * 400_000], 400_000)
    assert second == 400_000
    third = proxy.place([b"c" * 400_000], 400_000)  # would wrap: no room at the start yet
    assert third is None
    recorder.view(first, 400_000)
    recorder.release()  # the first is parsed: its room is free again
    third = proxy.place([b"c" * 400_000], 400_000)
    assert third == 1 << 20 and bytes(recorder.view(third, 400_000)) == b"c" * 400_000
    recorder.release()
    assert proxy.place([b"d" * 10], 10) == 2 << 20  # empty: from the start again
    assert proxy.place([b"e"], 2 << 20) is None  # larger than the ring


def test_a_reader_that_copies_frees_the_ring_at_once() -> None:
    proxy, recorder = rings(1 << 20)
    ex = big(7)
    r, w = os.pipe()
    os.writev(w, exchange_frame(ex, proxy))
    os.close(w)
    got = FrameReader(r, recorder).read()
    os.close(r)
    assert got == [(EXCHANGE, joined(ex))] and isinstance(got[0][1].body, bytes)
    assert proxy.freed[0] == proxy.head
