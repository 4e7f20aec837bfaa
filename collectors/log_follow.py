"""Follow a router log file (or a stream such as stdin) and hand back complete new lines."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import IO, Any, Protocol

LOG_POSITIONS = "log_positions"  # store meta: where each followed log file was read up to


def fresh_seq() -> int:
    """The first line number of a log read from scratch: the microsecond it started, above
    any number an earlier reader (one line per microsecond at most) gave a line."""
    return time.time_ns() // 1000


class _Meta(Protocol):
    def meta(self, key: str) -> Any: ...

    def set_meta(self, key: str, value: Any) -> None: ...


class LogFollower:
    """Reads lines appended to ``path`` since the last call; starts over when the file is
    truncated or replaced (another inode). ``position``/``resume`` let a restarted collector
    go on where the last one stopped instead of reading (and storing) the log again.

    The file is the one ``path`` named when the follower started (a symlink then is resolved
    once): a symlink swapped in for it later is not followed, only counted (``refused``), so a
    log allowed by the config cannot be turned into any file the collector can read.

    ``seq`` numbers the lines in the order they were written (``first_seq``: the first line
    of the last read's); it goes on across a rotation and a resumed collector."""

    def __init__(self, path: str, from_start: bool = True, max_line: int = 1 << 20,
                 max_read: int = 8 << 20) -> None:
        self.path = path
        self._real = os.path.realpath(path)
        self.refused = 0  # reads refused: a symlink stood where the file was
        self.inode = self._stat()[0]
        self.offset = 0 if from_start else self._stat()[1]
        self.max_line = max_line
        self.max_read = max_read  # per call: a tick reads a backlog over several calls
        self.backlog = 0  # bytes written to the file and not read yet, as of the last call
        # Reads land in one buffer kept across calls (a fresh 8 MiB object per read costs
        # more than the read); its first ``_keep`` bytes are a line not complete yet.
        self._buf = bytearray()
        self._keep = 0
        self.seq = self.first_seq = fresh_seq()

    def _stat(self, count: bool = True) -> tuple[int | None, int]:
        try:
            st = os.lstat(self._real)
        except OSError:
            return None, 0
        if stat.S_ISLNK(st.st_mode):
            self.refused += count
            return None, 0
        return st.st_ino, st.st_size

    def position(self) -> dict[str, int | None]:
        """Where the next complete line starts, and its number."""
        return {"inode": self.inode, "offset": self.offset - self._keep,
                "seq": self.seq}

    def resume(self, saved: object) -> bool:
        """Go on from a ``position()`` of the same file; anything else is ignored."""
        if not isinstance(saved, dict):
            return False
        inode, offset = saved.get("inode"), saved.get("offset")
        ino, size = self._stat()
        if inode != ino or type(offset) is not int or not 0 <= offset <= size:
            return False
        self.offset, self._keep = offset, 0
        seq = saved.get("seq")
        if type(seq) is int:
            self.seq = self.first_seq = seq
        return True

    def has_new(self) -> bool:
        """Whether the file grew, shrank or was replaced since the last read."""
        inode, size = self._stat(count=False)  # the read that follows counts a refusal
        return inode != self.inode or size != self.offset

    def read_new(self) -> list[str]:
        inode, size = self._stat()
        if inode != self.inode or size < self.offset:  # replaced, truncated or rotated
            self.inode, self.offset, self._keep = inode, 0, 0
        # Counted once a read happened: a file that cannot be opened is not a backlog the
        # collector could catch up on (its run loop would skip its waits for it).
        self.backlog = 0
        if size == self.offset:
            return []
        try:
            fd = os.open(self._real, os.O_RDONLY | os.O_NOFOLLOW)  # swapped since the lstat
        except OSError:
            return []
        want, keep = min(size - self.offset, self.max_read), self._keep
        if len(self._buf) < keep + want:
            self._buf.extend(bytes(keep + want - len(self._buf)))
        try:
            if os.fstat(fd).st_ino != inode:
                return []
            with memoryview(self._buf) as view:
                got = os.preadv(fd, [view[keep:keep + want]], self.offset)
        finally:
            os.close(fd)
        self.offset += got
        self.backlog = max(0, size - self.offset)
        end = keep + got
        cut = self._buf.rfind(b"\n", 0, end) + 1
        with memoryview(self._buf) as view:
            # One decode for the whole read: no UTF-8 sequence holds a newline byte, so its
            # lines are those decoded one by one.
            text = str(view[:cut], "utf-8", "replace") if cut else ""
            rest = end - cut
            if rest > self.max_line:
                rest = 0
            self._buf[:rest] = bytes(view[cut:cut + rest])
        self._keep = rest
        out = [ln for ln in text.split("\n") if ln and not ln.isspace()] if cut else []
        self.first_seq, self.seq = self.seq, self.seq + len(out)
        return out


class StreamFollower:
    """Lines from a blocking stream (stdin), read on a daemon thread. At most ``max_buffer``
    lines wait between reads; past that the oldest are dropped and counted (``dropped``)."""

    backlog = 0  # every call takes what the thread has buffered

    def __init__(self, stream: IO[str], max_buffer: int = 100_000) -> None:
        self.lines: deque[str] = deque(maxlen=max_buffer)
        self.dropped = 0
        self.seq = self.first_seq = fresh_seq()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        lines = self.lines
        for line in stream:
            if line.strip():
                if len(lines) == lines.maxlen:
                    self.dropped += 1
                lines.append(line)

    def has_new(self) -> bool:
        return bool(self.lines)

    def read_new(self) -> list[str]:
        out = []
        while self.lines:
            out.append(self.lines.popleft())
        self.first_seq, self.seq = self.seq, self.seq + len(out)
        return out


def resume_followers(store: _Meta, followers: Mapping[str, object]) -> Iterable[str]:
    """Names of the file followers that go on where an earlier collector stopped."""
    saved = store.meta(LOG_POSITIONS)
    if not isinstance(saved, dict):
        return []
    return [name for name, f in followers.items()
            if isinstance(f, LogFollower) and f.resume(saved.get(f.path))]


def save_positions(store: _Meta, followers: Mapping[str, object],
                   last: dict[str, Any]) -> dict[str, Any]:
    """Store the followers' positions when they moved; returns what is now stored."""
    pos = {f.path: f.position() for f in followers.values() if isinstance(f, LogFollower)}
    if pos and pos != last:
        saved = store.meta(LOG_POSITIONS)
        store.set_meta(LOG_POSITIONS, {**(saved if isinstance(saved, dict) else {}), **pos})
        return pos
    return last
