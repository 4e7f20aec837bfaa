"""The ingest processes' garbage-collector settings: start-up objects frozen out of every
collection, collections rarer than CPython's default."""

from __future__ import annotations

import gc

from mmlens.cli.gc_tuning import THRESHOLDS, tune_gc


def test_tune_gc_freezes_startup_and_raises_thresholds() -> None:
    before = gc.get_threshold()
    kept = [{"startup": i} for i in range(1000)]  # a start-up structure, alive afterwards
    try:
        tune_gc()
        assert gc.get_threshold() == THRESHOLDS
        assert THRESHOLDS[0] > before[0]
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
