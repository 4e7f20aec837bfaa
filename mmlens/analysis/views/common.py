"""Formatting the pages share."""

from __future__ import annotations

import time


def clock(ts: float | None) -> str:
    """``HH:MM:SS`` (UTC), or "—"."""
    return "—" if ts is None else time.strftime("%H:%M:%S", time.gmtime(ts))


def short_worker(url: str | None) -> str:
    """A worker URL without its scheme (``grpc://127.0.0.1:50051`` → ``127.0.0.1:50051``)."""
    if not url:
        return "—"
    return url.split("://", 1)[-1]


def pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.0%}"
