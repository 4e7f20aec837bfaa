"""The outage buffer's options, shared by ``mmlens collect`` and ``mmlens tap`` (one buffer,
``mmlens.collectors.store_buffer``, for every writer of the store)."""

from __future__ import annotations

import argparse

from mmlens.collectors.store_buffer import MAX_MEMORY


def add_buffer_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--spill-dir", help="where records held through a store outage spill "
                    "past the in-memory bound (default: the system's temporary folder); a "
                    "collector or tap started on the same store and folder writes what one "
                    "that died left there")
    ap.add_argument("--buffer-records", type=int, default=MAX_MEMORY,
                    help="records held in memory through a store outage before the oldest "
                    f"spill to --spill-dir (default {MAX_MEMORY:,})")
