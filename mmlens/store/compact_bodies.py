"""Bodies without the fields at their defaults: a decision names ~6 of its 25 fields, so
most of its JSON was ``null`` and ``[]``. The readers decode a missing field to its default
(``codec``), so a compact body reads back as the record it was written from; bodies written
in full by earlier versions read as before. The dicts are built in one compiled walk
(``_typed.compact``); without it, records are written in full (the same records read back).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mmlens.records import RequestTrace, RoutingDecision

try:
    from mmlens.store import _typed as _native
except ImportError:  # pragma: no cover - no compiler at install time
    _native = None

# the omit codes of _typed.c
KEEP, OMIT_NONE, OMIT_EMPTY_LIST = range(3)


def omit_of(f: dataclasses.Field[Any]) -> int:
    """When a field can be left out: its default is None or an empty list (a default the
    decoder makes again); any other default is written."""
    if f.default is None:
        return OMIT_NONE
    if f.default_factory is list:
        return OMIT_EMPTY_LIST
    return KEEP


def omits_of(cls: type) -> tuple[tuple[str, int], ...]:
    return tuple((f.name, omit_of(f)) for f in dataclasses.fields(cls))


def _setup() -> bool:
    if _native is None:
        return False
    _native.setup_compact({c: omits_of(c) for c in (RoutingDecision, RequestTrace)})
    return True


READY = _setup()


def compact(records: list[Any]) -> list[Any]:
    """Each record as a dict of its fields less those at their default (the records as
    they are where the walk is not built). Records of the set-up types only."""
    return _native.compact(records) if READY else records
