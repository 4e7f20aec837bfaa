"""Garbage-collector settings for mmlens' long-running ingest processes (``collect``, ``tap``).

Parsing a router's debug log or a span export allocates millions of short-lived dicts; with
CPython's default thresholds (700, 10, 10) that triggers a full collection every few hundred
thousand allocations, and each full collection walks every live container — the resident-KV
index and the pending requests of a collector included. Measured on the SMG/Dynamo captures
(``benchmarks/observed_ingest.py``), the default settings cost about 45 % of Dynamo log ingest
once the process holds a large heap. Nearly everything mmlens allocates is freed by reference
counting (no cycles), so collecting less often costs little memory.
"""

from __future__ import annotations

import gc

THRESHOLDS = (10_000, 100, 100)
# The tap's recorder process: a batch of records (up to 2,000, each a few dozen containers)
# stays alive until it is written, so each young collection walks and promotes it again.
# Measured with ``tap_bench``'s 64² traffic: the collector's share of the recorder's perf
# samples 3.4 % against 6.6 % at ``THRESHOLDS``; its CPU per request 49.2 against 52.5 µs in
# one run of 6 interleaved passes of 3,000 (44.9 against 44.2 in another: within the noise
# of a shared machine).
RECORDER_THRESHOLDS = (100_000, 1000, 1000)


def tune_gc(thresholds: tuple[int, int, int] = THRESHOLDS) -> None:
    """Move what start-up built out of the collector's way and collect less often."""
    gc.collect()
    gc.freeze()  # imported modules, config, tokenizers: never garbage, never walked again
    gc.set_threshold(*thresholds)
