"""Where the recorded router outputs used as fixtures live (copies, never the shared tree)."""

from __future__ import annotations

from pathlib import Path

CAPTURES = Path(__file__).parent / "fixtures" / "captures"


def capture(name: str) -> str:
    return (CAPTURES / name).read_text()
