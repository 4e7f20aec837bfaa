"""Write only what reads back: each record is checked, before it is stored, with the decode the
readers use (``codec``) and for what the backends refuse (a lone surrogate, a NUL in text, a
time no partition can hold). A record that fails is set aside alone, named and counted
(``StoreWrites.rejected``), never written to be skipped by every reader later."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

from mmlens.records import ErrorCounts, count_error

T = TypeVar("T")
MAX_TS = float(1 << 33)  # the year 2242: past it, no clock is right (nor a partition's name)
ENCODE_ERRORS = (UnicodeError, ValueError, TypeError, OverflowError, RecursionError)


def text_ok(value: str | None) -> bool:
    """Text every backend stores as it was given (PostgreSQL refuses NUL, both refuse lone
    surrogates)."""
    if value is None:
        return True
    if "\x00" in value:
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def ts_ok(ts: float) -> bool:
    return math.isfinite(ts) and 0 <= ts <= MAX_TS


def checked(rejected: ErrorCounts, kind: str, where: str, encode: Callable[[], T],
            reads_back: Callable[[T], bool]) -> T | None:
    """``encode()`` (a row or a body), or None when it cannot be encoded or does not read
    back: set aside in ``rejected`` as ``unwritable_<kind>``, named by ``where``."""
    try:
        out = encode()
        if reads_back(out):
            return out
        detail = "does not read back"
    except ENCODE_ERRORS as exc:
        detail = f"{type(exc).__name__}: {exc}"
    count_error(rejected, f"unwritable_{kind}", detail, where)
    return None


def all_text_ok(*values: Any) -> bool:
    return all(text_ok(v) for v in values if isinstance(v, str) or v is None)
