"""Follow a router log file (or a stream such as stdin) and hand back complete new lines."""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import IO


class LogFollower:
    """Reads lines appended to ``path`` since the last call; restarts on truncation."""

    def __init__(self, path: str, from_start: bool = True, max_line: int = 1 << 20) -> None:
        self.path = path
        self.offset = 0 if from_start else self._size()
        self.max_line = max_line
        self._partial = b""

    def _size(self) -> int:
        try:
            return os.path.getsize(self.path)
        except OSError:
            return 0

    def read_new(self) -> list[str]:
        size = self._size()
        if size < self.offset:  # truncated or rotated
            self.offset, self._partial = 0, b""
        if size == self.offset:
            return []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(size - self.offset)
        except OSError:
            return []
        self.offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > self.max_line:
            self._partial = b""
        return [ln.decode("utf-8", "replace") for ln in lines if ln.strip()]


class StreamFollower:
    """Lines from a blocking stream (stdin), read on a daemon thread."""

    def __init__(self, stream: IO[str], max_buffer: int = 100_000) -> None:
        self.lines: deque[str] = deque(maxlen=max_buffer)
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            if line.strip():
                self.lines.append(line)

    def read_new(self) -> list[str]:
        out = []
        while self.lines:
            out.append(self.lines.popleft())
        return out
