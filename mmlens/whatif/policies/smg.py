"""SMG 1.13 ``cache_aware`` (gRPC), in router mode (it expands images and routes on the
expanded ids: content-blind, two images of one token count look the same) or worker mode
(one anchor per image: only the text before the first image can match the engines' blocks).

Two paths, as SMG takes them:
- event-driven, once its event index holds anything: the index keys each block the engines
  announced by its token ids (the blind key); the worker with the longest match wins, then
  the lower load, then chance (``event_hit``); no match: the least-loaded worker
  (``event_miss``);
- the approximate token tree before any event: its own record of where it sent each prefix;
  a match over ``cache_threshold`` of the request's tokens picks the least-loaded matched
  worker (``tree_match``), else the least loaded (``expected_wait_fallback``).
Either match passes the spill gate: when the chosen worker's in-flight load exceeds both
``average × balance_rel_threshold`` and ``average + balance_abs_threshold``, the request
spills to the least-loaded worker (``spill``).

Defaults are SMG 1.13's Rust CLI defaults (``smg launch --help``, reference §6.1).
Not modelled: the tree's ``eviction_interval`` pruning (``max_tree_size`` 2^26 tokens is never
reached by a recorded window), ``overlap_decay`` and ``selection_temperature`` (0 by default),
the KV-pressure escape (off at the defaults 1.0), and SMG 1.13's expected-wait score on the
fallback (modelled as the least in-flight count, SMG's documented min-load order).
"""

from __future__ import annotations

import math

from mmlens.whatif.blocks import Prompt
from mmlens.whatif.index import BlockIndex
from mmlens.whatif.policies.base import Choice, Loads, Policy

PARAMS: dict[str, object] = {
    "cache_threshold": 0.3, "balance_abs_threshold": 64, "balance_rel_threshold": 1.5,
    "eviction_interval": 120, "max_tree_size": 1 << 26, "block_size": 16,
}


class CacheAware(Policy):
    name = "cache_aware"
    events = True

    def __init__(self, n_workers: int, block_size: int, seed: int = 0, mode: str = "router",
                 cache_threshold: float = 0.3, balance_abs_threshold: float = 64,
                 balance_rel_threshold: float = 1.5, **_ignored: object) -> None:
        super().__init__(n_workers, block_size, seed)
        if mode not in ("router", "worker"):
            raise ValueError(f"SMG multimodal processing mode must be router or worker, not "
                             f"{mode!r}")
        self.view = "blind" if mode == "router" else "unexpanded"
        self.threshold = float(cache_threshold)
        self.abs_threshold = float(balance_abs_threshold)
        self.rel_threshold = float(balance_rel_threshold)
        self.index = BlockIndex()  # from KV events: blind keys
        self.tree = BlockIndex()  # the approximate tree: its own decisions

    def choose(self, p: Prompt, keys: tuple[int, ...], now: float, loads: Loads) -> Choice:
        if len(self.index):
            depth, holders = self.index.deepest(keys)
            if not depth:
                return Choice(loads.least_loaded(), "event_miss", 0)
            return self._gate(loads.least_loaded_of(holders, self.rng), depth, "event_hit",
                              loads)
        depth, holders = self.tree.deepest(keys)
        routed = max(p.tokens if self.view == "blind" else len(keys) * self.block_size, 1)
        if depth and depth * self.block_size / routed > self.threshold:
            return self._gate(loads.least_loaded_of(holders, self.rng), depth, "tree_match",
                              loads)
        return Choice(loads.least_loaded(), "expected_wait_fallback", 0)

    def _gate(self, w: int, depth: int, branch: str, loads: Loads) -> Choice:
        avg = loads.total_inflight / loads.n
        load = loads.inflight[w]
        if load > avg * self.rel_threshold and load > avg + self._margin(avg):
            return Choice(loads.least_loaded(), "spill", 0)
        return Choice(w, branch, depth)

    def _margin(self, avg: float) -> float:
        """The absolute part of the gate: ``balance_abs_threshold`` capped at the in-flight
        count's natural swing at the fleet's mean (two standard deviations of a Poisson
        count, never under 4 unless the threshold is lower), as ``smg launch --help`` 1.13
        describes it."""
        return min(self.abs_threshold, max(2 * math.sqrt(avg), 4.0))

    def stored(self, worker: int, content: list[int], blind: list[int], now: float) -> None:
        self.index.add(worker, blind)

    def removed(self, worker: int, content: int, blind: int) -> None:
        self.index.remove(worker, blind)

    def routed(self, worker: int, p: Prompt, keys: tuple[int, ...], now: float) -> None:
        if not len(self.index):
            self.tree.add(worker, keys)
