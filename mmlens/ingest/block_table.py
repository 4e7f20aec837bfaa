"""The resident blocks of one worker (hash → content state, None when unknown): the compiled
``BlockTable`` of ``mmlens/layout/_chain.c`` where it is built, else a dict.

The table holds each block as three 64-bit words (no int object per block) and stores or
removes a whole event's blocks in one call; it reads and writes like the dict it replaces.
``tests/core/test_block_table.py`` holds the two equal.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from mmlens.layout.content_keys import native

BlockTable: Any = None
if native is not None:

    class BlockTable(native.BlockTable, MutableMapping):  # type: ignore[no-redef]
        """The mapping views (values, items, ==) on top of the compiled table."""

        __slots__ = ()

        def __repr__(self) -> str:
            return f"BlockTable({dict(self.items())!r})"


def new_blocks(compiled: bool = True) -> MutableMapping[int, int | None]:
    """An empty resident-block map: the compiled table when there is one and ``compiled``."""
    return BlockTable() if compiled and BlockTable is not None else {}
