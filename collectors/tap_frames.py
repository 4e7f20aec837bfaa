"""The tap's exchanges on their way from the proxy to its recorder process: framed bytes on a
pipe, written by the proxy's event loop without blocking and read by the recorder in large
reads.

A frame: kind (1 byte), the length of its metadata and of its data (4 bytes each), the
metadata (msgpack), the data. An exchange's metadata is every field but the bytes; its data
is the request body and the kept response chunks as they came, written as they are held
(``os.writev``: no copy into one buffer). A health snapshot is a pickle (rare, and its error
counts are a dict subclass). A frame cut off by the proxy's death is never completed and is
dropped with the rest of what was unread.

A large exchange's data (a 1 MB image) goes through a ring of shared memory instead
(``Ring``): the proxy copies it there once and the pipe carries its metadata and where it
is; the recorder parses it in place and frees it at its next read. Through a pipe the same
bytes were copied into the kernel and out again, in pieces the size of the pipe, the proxy
woken each time the recorder had made room. Data the ring has no room for takes the pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import mmap
import os
import pickle
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from mmlens.ingest.tap_parse import Exchange

HEAD = struct.Struct("<BII")
EXCHANGE, HEALTH, STOP, RING = 1, 2, 3, 4  # RING: an exchange whose data is in the ring
PIPE_BYTES = 1 << 20  # asked of the kernel for the pipe (Linux: up to pipe-max-size)
MAX_IOV = 512
READ_BYTES = 1 << 20
MIN_FREE = 64 << 10  # room a read is given at least
RING_BYTES = 8 << 20  # four 2 MB image requests; more at once take the pipe
RING_MIN = 64 << 10  # smaller exchanges take the pipe: many go in one read

_meta_enc = msgspec.msgpack.Encoder()
_meta_dec = msgspec.msgpack.Decoder()


class Ring:
    """Shared memory between the proxy, which places exchanges' data in it, and the
    recorder, which frees it in the same order once parsed. Positions count every byte ever
    placed; ``freed`` (written by the recorder only) is where what is still in use begins.
    An exchange's data is contiguous (one that would wrap starts over at the ring's start),
    and an empty ring starts over too: the same pages serve a tap that records one large
    request at a time."""

    def __init__(self, fd: int, size: int, freed: Any) -> None:
        self.size = size
        self.freed = freed  # a shared array of one int64
        self._mm = mmap.mmap(fd, size)
        self._view = memoryview(self._mm)
        self.head = 0  # the proxy's: the end of what it placed
        self._held = -1  # the recorder's: the end of what it parses now

    @staticmethod
    def memory(size: int = RING_BYTES) -> int | None:
        """A file descriptor of ``size`` bytes of shared memory (None where there is no
        ``memfd_create``: exchanges then all take the pipe)."""
        try:
            fd = os.memfd_create("mmlens-tap-ring", os.MFD_CLOEXEC)
        except (AttributeError, OSError):
            return None
        os.ftruncate(fd, size)
        return fd

    def place(self, parts: list[bytes], n: int) -> int | None:
        """Copy ``parts`` (``n`` bytes) in: where they start, None without room."""
        head, size, freed = self.head, self.size, self.freed[0]
        pos = head % size
        start = head
        if freed >= head:  # empty
            start = head + (size - pos) % size
        elif pos + n > size:
            start = head + size - pos
        if n > size or (freed < head and start + n - freed > size):
            return None
        at = start % size
        for p in parts:
            self._view[at:at + len(p)] = p
            at += len(p)
        self.head = start + n
        return start

    def view(self, start: int, n: int) -> memoryview:
        """The recorder's view of data placed at ``start``, held until ``release``."""
        self._held = start + n
        at = start % self.size
        return self._view[at:at + n]

    def release(self) -> None:
        """What the recorder was given is parsed: the proxy may place data there again."""
        if self._held >= 0:
            self.freed[0] = self._held
            self._held = -1


def exchange_frame(ex: Exchange, ring: Ring | None = None) -> list[bytes]:
    parts = ex.body_parts
    body_n = len(ex.body) + sum(map(len, parts)) if parts else len(ex.body)
    head_t, head = _split(ex.chunks)
    tail_t, tail = _split(ex.tail)
    head_n, tail_n = list(map(len, head)), list(map(len, tail))
    size = body_n + sum(head_n) + sum(tail_n)
    data = [ex.body, *parts, *head, *tail]
    at = ring.place(data, size) if ring is not None and size >= RING_MIN else None
    meta = _meta_enc.encode((
        ex.ts, ex.t0, ex.client_request_id, ex.status, ex.headers, ex.sse, head_t, head_n,
        tail_t, tail_n, ex.kept, ex.tail_bytes, ex.overflow, ex.latency_s, ex.cut, body_n,
        -1 if at is None else at))
    if at is not None:
        return [HEAD.pack(RING, len(meta), 0), meta]
    return [HEAD.pack(EXCHANGE, len(meta), size), meta, *data]


def _split(chunks: list[tuple[float, bytes]]) -> tuple[list[float], list[bytes]]:
    """(arrival times, bytes) of timed chunks."""
    if len(chunks) == 1:  # most answers: one read
        return [chunks[0][0]], [chunks[0][1]]
    return [t for t, _ in chunks], [c for _, c in chunks]


def health_frame(row: Any) -> list[bytes]:
    data = pickle.dumps(row, pickle.HIGHEST_PROTOCOL)
    return [HEAD.pack(HEALTH, 0, len(data)), data]


def stop_frame() -> list[bytes]:
    return [HEAD.pack(STOP, 0, 0)]


def _exchange(meta: bytes | memoryview, data: memoryview | None, borrow: bool = False,
              ring: Ring | None = None) -> Exchange:
    (ts, t0, rid, status, headers, sse, head_t, head_n, tail_t, tail_n, kept, tail_bytes,
     overflow, latency_s, cut, body_n, ring_at) = _meta_dec.decode(meta)
    if data is None:  # in the ring
        if ring is None:
            raise ValueError("an exchange in a ring the reader does not have")
        data = ring.view(ring_at, body_n + sum(head_n) + sum(tail_n))
    at = body_n
    chunks, tail = [], []
    for out, times, sizes in ((chunks, head_t, head_n), (tail, tail_t, tail_n)):
        for t, n in zip(times, sizes, strict=True):
            out.append((t, bytes(data[at:at + n])))
            at += n
    body = data[:body_n] if borrow else bytes(data[:body_n])
    if not borrow and ring is not None:
        ring.release()
    return Exchange(ts, t0, body, rid, status, headers, sse, chunks, tail,
                    kept, tail_bytes, overflow, latency_s, cut)


class FrameReader:
    """Frames from the read end of the pipe, in reads of up to ``READ_BYTES`` into one
    buffer (grown for a frame larger than it), and the data of those in ``ring``."""

    def __init__(self, fd: int, ring: Ring | None = None) -> None:
        self.fd = fd
        self.ring = ring
        self._buf = bytearray(READ_BYTES)
        self._start = 0  # the first byte not yet taken
        self._end = 0  # the end of what was read
        self.last_read = 0  # bytes the last read brought

    def read(self, borrow: bool = False) -> list[tuple[int, Any]] | None:
        """What one read completed (kind, item), waiting for it; None at the end of the
        stream (the proxy closed its end or is gone). ``borrow``: an exchange's request
        body is a view of this reader's buffer or of the ring, good until the next read (no
        copy)."""
        self.release()
        if self._start == self._end:
            self._start = self._end = 0
        if len(self._buf) - self._end < MIN_FREE:
            self._make_room()
        n = self.last_read = os.readv(self.fd, [memoryview(self._buf)[self._end:]])
        if n == 0:
            return None
        self._end += n
        return list(self._frames(borrow))

    def release(self) -> None:
        """The exchanges of the last read are parsed: their place in the ring is free."""
        if self.ring is not None:
            self.ring.release()

    def _frames(self, borrow: bool) -> Iterator[tuple[int, Any]]:
        view = memoryview(self._buf)
        while self._end - self._start >= HEAD.size:
            kind, meta_n, data_n = HEAD.unpack_from(self._buf, self._start)
            at = self._start + HEAD.size
            if self._end - at < meta_n + data_n:
                break
            meta, data = view[at:at + meta_n], view[at + meta_n:at + meta_n + data_n]
            self._start = at + meta_n + data_n
            if kind == EXCHANGE:
                yield kind, _exchange(meta, data, borrow)
            elif kind == RING:
                yield EXCHANGE, _exchange(meta, None, borrow, self.ring)
            elif kind == HEALTH:
                yield kind, pickle.loads(data)
            else:
                yield kind, None

    def _make_room(self) -> None:
        """The buffer is nearly full: what is not taken moves to its start, and a frame
        larger than the buffer gets one that holds it (a buffer grown for one shrinks
        again)."""
        rest = self._buf[self._start:self._end]
        need = len(rest) + MIN_FREE
        if len(rest) >= HEAD.size:
            _, meta_n, data_n = HEAD.unpack_from(rest, 0)
            need = max(need, HEAD.size + meta_n + data_n)
        if need > len(self._buf) or (len(self._buf) > READ_BYTES >= need):
            self._buf = bytearray(max(need, READ_BYTES))
        self._buf[:len(rest)] = rest
        self._start, self._end = 0, len(rest)


class PipeWriter:
    """Frames onto the write end without blocking: what the pipe cannot take yet is kept in
    order and written when it can (the event loop watches the pipe then). ``send`` may be
    called from any thread; frames sent on the loop in one iteration go in one write."""

    def __init__(self, fd: int, broken: Callable[[], None]) -> None:
        self.fd = fd
        self.broken = broken  # called once when the reader is gone
        os.set_blocking(fd, False)
        try:
            import fcntl

            fcntl.fcntl(fd, 1031, PIPE_BYTES)  # F_SETPIPE_SZ: fewer wake-ups of the reader
        except (ImportError, OSError):
            pass
        self._bufs: deque[bytes | memoryview] = deque()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None  # the thread running ``_loop``
        self._due = False  # a flush is scheduled on the loop
        self._watching = False  # the loop waits for the pipe to take more
        self.closed = False

    def pending(self) -> int:
        return len(self._bufs)

    def send(self, parts: list[bytes]) -> None:
        if self.closed:
            return
        with self._lock:
            self._bufs.extend(parts)
        if threading.get_ident() != self._loop_thread:  # (asking asyncio costs a getpid)
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is None:  # another thread: written now, or left for the loop
                self.flush()
                if self._bufs and self._loop is not None:
                    with contextlib.suppress(RuntimeError):  # the loop has closed
                        self._loop.call_soon_threadsafe(self._on_loop)
                return
            self._loop, self._loop_thread = loop, threading.get_ident()
        if not self._due and self._loop is not None:
            self._due = True
            self._loop.call_soon(self._on_loop)

    def _on_loop(self) -> None:
        self._due = False
        self.flush()
        loop = self._loop
        if loop is None or self.closed:
            return
        if self._bufs and not self._watching:
            loop.add_writer(self.fd, self._on_loop)
            self._watching = True
        elif not self._bufs and self._watching:
            loop.remove_writer(self.fd)
            self._watching = False

    def flush(self) -> None:
        """Write what the pipe takes now."""
        with self._lock:
            bufs = self._bufs
            while bufs and not self.closed:
                try:
                    n = os.writev(self.fd, list(itertools.islice(bufs, MAX_IOV)))
                except BlockingIOError:
                    return
                except OSError:  # the reader is gone: nothing will take these
                    self.closed = True
                    bufs.clear()
                    self.broken()
                    return
                while n and bufs:
                    first = bufs[0]
                    if len(first) <= n:
                        n -= len(first)
                        bufs.popleft()
                    else:
                        bufs[0] = memoryview(first)[n:]
                        n = 0

    def close(self, final: list[bytes]) -> None:
        """Everything held and ``final`` written, waiting for the pipe as long as it takes
        (the loop has stopped), then the write end closed."""
        if self.closed:
            return
        with self._lock:
            self._bufs.extend(final)
        os.set_blocking(self.fd, True)
        self.flush()
        self.closed = True
        os.close(self.fd)
