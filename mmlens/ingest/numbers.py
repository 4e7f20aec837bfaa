"""Lenient number reads for fields that arrive as numbers or strings (logs, span attributes,
response bodies): None instead of an exception when a value is missing or not a number."""

from __future__ import annotations

from typing import Any


def as_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return None


def as_float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None
