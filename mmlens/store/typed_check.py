"""Whether records hold values of their fields' declared types, checked in one compiled walk
(``_typed.c``): the write path's shortcut past its read-back decode, for batches it passes.
A record it fails (or a type it has no spec of) goes the read-back way, which decides."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from mmlens.records import RequestTrace, RoutingDecision

try:
    from mmlens.store import _typed as _native
except ImportError:  # pragma: no cover - no compiler at install time
    _native = None

# the kind codes of _typed.c
STR, INT, FLOAT, BOOL, LITERAL, LIST, DICT_STR, RECORD, ANY, UNION = range(1, 11)
OPTIONAL = 32


def kind_of(tp: Any) -> tuple[int, Any]:
    """An annotation as the compiled check's (code, arg); TypeError for one it has none of."""
    if tp is Any:
        return ANY, None
    if tp is str:
        return STR, None
    if tp is bool:
        return BOOL, None
    if tp is int:
        return INT, None
    if tp is float:
        return FLOAT, None
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return RECORD, tp
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal and all(type(a) is str for a in args):
        return LITERAL, frozenset(args)
    if origin in (typing.Union, types.UnionType):
        kinds = tuple(kind_of(a) for a in args if a is not type(None))
        code, arg = kinds[0] if len(kinds) == 1 else (UNION, kinds)
        return (code | OPTIONAL, arg) if type(None) in args else (code, arg)
    if origin is list and len(args) == 1:
        return LIST, kind_of(args[0])
    if origin is dict and len(args) == 2 and args[0] is str:
        return DICT_STR, kind_of(args[1])
    raise TypeError(f"no kind for {tp!r}")


def specs_of(cls: type) -> dict[type, tuple[tuple[str, int, Any], ...]]:
    """The specs of a record dataclass and of the records it holds."""
    out: dict[type, tuple[tuple[str, int, Any], ...]] = {}

    def add(c: type) -> None:
        if c in out:
            return
        hints = typing.get_type_hints(c)
        fields = tuple((f.name, *kind_of(hints[f.name])) for f in dataclasses.fields(c))
        out[c] = fields
        for _, code, arg in fields:
            for inner in _records(code, arg):
                add(inner)

    add(cls)
    return out


def _records(code: int, arg: Any) -> list[type]:
    code &= ~OPTIONAL
    if code == RECORD:
        return [arg]
    if code in (LIST, DICT_STR):
        return _records(*arg)
    if code == UNION:
        return [r for kind in arg for r in _records(*kind)]
    return []


def _setup() -> bool:
    if _native is None:
        return False
    try:
        _native.setup({**specs_of(RoutingDecision), **specs_of(RequestTrace)})
    except TypeError:  # pragma: no cover - a field of a type it has no kind of
        return False
    return True


READY = _setup()


def all_typed(records: list[Any]) -> bool:
    """Every record holds values of its declared types (False also where the check is not
    built: the caller then decodes to know)."""
    return READY and bool(_native.all_typed(records))
