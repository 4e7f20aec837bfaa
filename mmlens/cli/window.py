"""`--since` / `--until` for commands that read a recorded window (`mmlens replay`): a Unix
time in seconds or an ISO 8601 time (UTC when it names no zone); unset ends take the
store's first and last trace."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime


def parse_time(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is neither Unix seconds nor an ISO 8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def add_window_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since", type=parse_time, metavar="TIME",
                   help="window start: Unix seconds or ISO 8601 (default: the first trace)")
    p.add_argument("--until", type=parse_time, metavar="TIME",
                   help="window end: Unix seconds or ISO 8601 (default: the last trace)")


def window(args: argparse.Namespace, span: tuple[float, float] | None,
           ) -> tuple[float, float] | None:
    """The window asked for, open ends filled from the store's ``span`` (None: no traces and
    an open end)."""
    if span is None and (args.since is None or args.until is None):
        return None
    lo, hi = span or (0.0, 0.0)
    return (args.since if args.since is not None else lo,
            args.until if args.until is not None else hi)
