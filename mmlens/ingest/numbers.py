"""Lenient number reads for fields that arrive as numbers or strings (logs, span attributes,
response bodies): None instead of an exception when a value is missing or not a number."""

from __future__ import annotations

from typing import Any

LIMIT = 1 << 64  # no count, id or hash a router logs is larger (u64 hashes included)


def as_int(v: Any) -> int | None:
    """An integer within ±2^64, else None (a 5,000-digit number is not a token count)."""
    if v is None:
        return None
    if type(v) is int:  # most values: what int() would return, without its call
        return v if -LIMIT < v < LIMIT else None
    if isinstance(v, str) and len(v) > 40:
        return None  # int() of thousands of digits is slow or refused
    try:
        n = int(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return n if -LIMIT < n < LIMIT else None


def as_float(v: Any) -> float | None:
    if v is None:
        return None
    if type(v) is float:
        return v
    if isinstance(v, str) and len(v) > 400:
        return None
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return None
