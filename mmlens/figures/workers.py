"""One colour per worker, the same on every chart: ``w1``, ``w2`` … take the palette in order;
any other name a stable slot of its own. No red or green: those mean miss and hit."""

from __future__ import annotations

import re
import zlib

PALETTE = ("#3b6fd8", "#e08a1e", "#7b4fc9", "#1b9aaa", "#b5651d", "#c2489b", "#5c6f82",
           "#8a9a1b")
_NUMBERED = re.compile(r"^w(\d+)(?:#\d+)?$")


def worker_colour(name: str) -> str:
    m = _NUMBERED.match(name)
    if m and int(m[1]) >= 1:
        return PALETTE[(int(m[1]) - 1) % len(PALETTE)]
    return PALETTE[zlib.crc32(name.encode()) % len(PALETTE)]


def faded(colour: str, alpha: float = 0.4) -> str:
    """``#rrggbb`` as an rgba with ``alpha``: the same worker, a secondary series."""
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"
