"""The file a store's writer spills its outage backlog to, and the ones writers that died left.

A spill file holds length-prefixed frames (8 bytes of length, 4 of record count, then the
frame); its owner keeps an exclusive ``flock`` on it for as long as it lives, so a file whose
lock can be taken was left by a writer that is gone (killed, crashed, stopped with a
backlog): ``orphans`` adopts those, taking the lock, for replay by the caller. Files are named
by the store they belong to (``scope``), so a writer never adopts another store's backlog.

How far a file was written to the store is the store's to say (a meta row written in the
same transaction as each frame's records, ``mmlens.collectors.store_buffer``): the file is
only ever appended to, and unlinked once wholly written.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

HEADER = 12
PREFIX = "mmlens-backlog-"


def scope_of(identity: str) -> str:
    """A short name for the store ``identity`` (its path or URL) for the files' names."""
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


class SpillFile:
    """One spill file, locked by this process from the moment it exists."""

    def __init__(self, path: Path, fd: int | None = None) -> None:
        self.path = path
        self._fd = fd  # the locked descriptor (None: not created yet)

    @classmethod
    def new(cls, folder: Path, scope: str) -> SpillFile:
        name = f"{PREFIX}{scope}-{os.getpid()}-{time.time_ns()}.spill"
        return cls(folder / name)

    @property
    def name(self) -> str:
        return self.path.name

    def append(self, frame: bytes, count: int) -> None:
        """Append one frame; a frame that does not fit (a full disk) is cut off again so the
        file stays readable, and the ``OSError`` raised."""
        if self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._fd = fd
        size = os.fstat(self._fd).st_size
        data = len(frame).to_bytes(8, "big") + count.to_bytes(4, "big") + frame
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, size)
            raise

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def frames(self, start: int = 0) -> Iterator[tuple[int, int, bytes]]:
        """(offset after the frame, record count, frame) from byte ``start`` on; a frame
        cut short (its writer killed mid-write) ends the file."""
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(start)
            while len(header := f.read(HEADER)) == HEADER:
                n = int.from_bytes(header[:8], "big")
                frame = f.read(n)
                if len(frame) != n:
                    return
                yield f.tell(), int.from_bytes(header[8:], "big"), frame

    def records(self, start: int = 0) -> int:
        """Records in the frames from ``start`` on (reads the headers only)."""
        total, size = 0, self.size()
        if not size:
            return 0
        with self.path.open("rb") as f:
            pos = start
            while pos + HEADER <= size:
                f.seek(pos)
                header = f.read(HEADER)
                n = int.from_bytes(header[:8], "big")
                if pos + HEADER + n > size:
                    break
                total += int.from_bytes(header[8:], "big")
                pos += HEADER + n
        return total

    def remove(self) -> None:
        """Unlink the file (wholly written) and let its lock go."""
        self.path.unlink(missing_ok=True)
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def orphans(folder: Path, scope: str) -> list[SpillFile]:
    """The spill files of ``scope`` in ``folder`` no living writer holds, oldest first, each
    now locked by this process."""
    found: list[SpillFile] = []
    if not folder.is_dir():
        return found
    for path in sorted(folder.glob(f"{PREFIX}{scope}-*.spill"), key=_written_at):
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
        except OSError:  # gone meanwhile (its owner finished), or not ours to read
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its writer is alive
            os.close(fd)
            continue
        if not path.exists():  # finished and unlinked between the glob and the lock
            os.close(fd)
            continue
        found.append(SpillFile(path, fd))
    return found


def _written_at(path: Path) -> tuple[int, str]:
    try:
        return int(path.stem.rsplit("-", 1)[1]), path.name
    except (IndexError, ValueError):
        return 0, path.name
