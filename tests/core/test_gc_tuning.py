"""The ingest processes' garbage-collector settings: start-up objects frozen out of every
collection, collections rarer than CPython's default."""

from __future__ import annotations

import gc

from mmlens.cli.gc_tuning import RECORDER_THRESHOLDS, THRESHOLDS, tune_gc


def test_tune_gc_freezes_startup_and_raises_thresholds() -> None:
    before = gc.get_threshold()
    kept = [{"startup": i} for i in range(1000)]  # a start-up structure, alive afterwards
    try:
        tune_gc()
        assert gc.get_threshold() == THRESHOLDS
        assert THRESHOLDS[0] > 700 and THRESHOLDS[1:] > (10, 10)  # CPython's defaults
        assert gc.get_freeze_count() >= len(kept)
    finally:  # (an in-process `collect`/`tap` test may have tuned this process already)
        gc.unfreeze()
        gc.set_threshold(*before)


def test_the_tap_recorder_collects_young_objects_less_often_still() -> None:
    before = gc.get_threshold()
    try:
        tune_gc(RECORDER_THRESHOLDS)
        assert gc.get_threshold() == RECORDER_THRESHOLDS
        assert RECORDER_THRESHOLDS[0] > THRESHOLDS[0]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
