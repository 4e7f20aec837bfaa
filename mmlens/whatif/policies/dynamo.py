"""Dynamo 1.6.1's KV router (frontend ``--router-mode kv``).

Per worker: ``cost = prefill_load_scale × max(raw_prefill_blocks − credit × overlap, 0)
+ decode_blocks + decode_active_request_weight × active requests``, with
``raw_prefill_blocks = (active prefill tokens + prompt tokens) / block_size`` and
``decode_blocks`` the worker's projected active blocks with this request added: the distinct
blocks of its requests in flight (requests sharing a prefix share its blocks) plus this
request's blocks it does not already have in flight (its ``ActiveSequences``:
``active_blocks + new_blocks``). Lowest cost wins, exact ties at random; with
``router_temperature`` > 0, a softmax over the costs normalized to [0, 1].

Its view of a request: with exact MM routing (Qwen3-VL, Kimi) each image's run carries a
per-image pad value from its mm_hash, so blocks key on content (the ``content`` view); for
families it does not support (GLM-5.3-Flash) it falls back to the rendered text with one
placeholder per image (``text_prefix``: the ``unexpanded`` view, which matches the engines'
blocks only before the first image). Overlap comes from the engines' KV events, or with
``kv_events`` off (``--no-router-kv-events``) from its own decisions, each block kept
``router_ttl_secs`` after it was last routed. A request's routing blocks are its full blocks
plus, when its length is not a block multiple, a padded last block (counted as its own).

Defaults are 1.6.1's (``python -m dynamo.frontend --help``): credit 1.0, prefill load scale
1.0, temperature 0, decay 0, decode request weight 0, KV events on, TTL 120 s. Not modelled:
host/disk cache tiers (no offload in the engines modelled), the busy thresholds (unset by
default), the router queue (off by default), ``overlap_score_credit_decay``, output-block
tracking (off by default), and the optional BOS of the routing ids.
"""

from __future__ import annotations

import math
from bisect import insort

from mmlens.whatif.blocks import Prompt
from mmlens.whatif.index import BlockIndex, ExpiringIndex, workers_of
from mmlens.whatif.policies.base import Choice, Loads, Policy

PARAMS: dict[str, object] = {
    "router_kv_overlap_score_credit": 1.0, "router_prefill_load_scale": 1.0,
    "router_temperature": 0.0, "router_decode_active_request_weight": 0.0,
    "kv_events": True, "router_ttl_secs": 120.0, "mm_routing": "exact",
}


class KvRouter(Policy):
    name = "dynamo_kv"

    def __init__(self, n_workers: int, block_size: int, seed: int = 0,
                 router_kv_overlap_score_credit: float = 1.0,
                 router_prefill_load_scale: float = 1.0, router_temperature: float = 0.0,
                 router_decode_active_request_weight: float = 0.0, kv_events: bool = True,
                 router_ttl_secs: float = 120.0, mm_routing: str = "exact",
                 **_ignored: object) -> None:
        super().__init__(n_workers, block_size, seed)
        if mm_routing not in ("exact", "text_prefix"):
            raise ValueError(f"mm_routing must be exact or text_prefix, not {mm_routing!r}")
        self.view = "content" if mm_routing == "exact" else "unexpanded"
        self.credit = float(router_kv_overlap_score_credit)
        self.scale = float(router_prefill_load_scale)
        self.temperature = float(router_temperature)
        self.request_weight = float(router_decode_active_request_weight)
        self.events = bool(kv_events)
        self.index = BlockIndex()
        self.approx = ExpiringIndex(float(router_ttl_secs))
        # Requests in flight per worker: how many hold each full block, which workers hold
        # it (to read a request's blocks already in flight as a prefix match), and the
        # padded last blocks (one a request, never shared).
        self.in_flight: list[dict[int, int]] = [{} for _ in range(n_workers)]
        self.in_flight_index = BlockIndex()
        self.padded = [0] * n_workers
        self._base: list[float] = []
        self._by_base: list[int] = []

    def choose(self, p: Prompt, keys: tuple[int, ...], now: float, loads: Loads) -> Choice:
        base = self._base_costs(loads)
        if self.temperature > 0 or self.credit > 1:
            groups = (self.index.groups(keys) if self.events
                      else self.approx.groups(keys, now))
            overlaps = {w: d for d, ws in groups for w in ws}
            shared = self.in_flight_index.overlaps(keys)
            costs = [self._cost(w, overlaps.get(w, 0), shared.get(w, 0), p.tokens, loads)
                     for w in range(self.n)]
            w = self._select(costs)
            depth = overlaps.get(w, 0)
        else:
            masks = (self.index.group_masks(keys) if self.events
                     else self.approx.group_masks(keys, now))
            w, depth = self._lowest(base, self._classes(
                masks, self.in_flight_index.group_masks(keys)))
        return Choice(w, "overlap" if depth else "no_overlap", depth)

    def _cost(self, w: int, overlap: int, shared: int, isl: int, loads: Loads) -> float:
        """The formula whole (its clamp at 0 bites only with a credit over 1); the request's
        own routing blocks, the same on every worker, left out."""
        return (self.scale * max((loads.prefill_tokens[w] + isl) / self.block_size
                                 - self.credit * overlap, 0.0)
                + self._active_blocks(w) - shared + self.request_weight * loads.inflight[w])

    def _active_blocks(self, w: int) -> int:
        return len(self.in_flight[w]) + self.padded[w]

    def _base_costs(self, loads: Loads) -> list[float]:
        """Per worker, its cost without the request's own prompt and overlaps (kept up to
        date for the workers whose load changed: the fleet's other workers cost the same),
        and ``_by_base``, the workers cheapest first."""
        if loads.touched is None or len(self._base) != self.n:
            loads.touched = set(range(self.n))
            self._base = [0.0] * self.n
            self._by_base = list(range(self.n))
        bs, scale, weight = self.block_size, self.scale, self.request_weight
        base, order = self._base, self._by_base
        for w in loads.touched:
            cost = (scale * loads.prefill_tokens[w] / bs + self._active_blocks(w)
                    + weight * loads.inflight[w])
            if cost != base[w]:
                order.remove(w)
                base[w] = cost
                insort(order, w, key=base.__getitem__)
        loads.touched.clear()
        return base

    def _classes(self, cached: list[tuple[int, int]], shared: list[tuple[int, int]],
                 ) -> list[tuple[float, int, int]]:
        """The fleet split by what a worker is credited: (credit in cost, cached overlap,
        mask of its workers), from the cached overlap's groups and the in-flight match's
        (a block the request shares with a request in flight there adds no decode block).
        With a credit of at most 1 the clamp never bites (an overlap is at most the
        prompt), so a worker costs ``own + base − credit``: only each class's cheapest
        workers can win."""
        full = (1 << self.n) - 1
        step = self.scale * self.credit
        rest_cached = full
        for _, m in cached:
            rest_cached &= ~m
        rest_shared = full
        for _, m in shared:
            rest_shared &= ~m
        out = []
        for depth, m1 in [*cached, (0, rest_cached)]:
            if not m1:
                continue
            for run, m2 in [*shared, (0, rest_shared)]:
                m = m1 & m2
                if m:
                    out.append((step * depth + run, depth, m))
        return out

    def _lowest(self, base: list[float], classes: list[tuple[float, int, int]],
                ) -> tuple[int, int]:
        """The lowest cost (its worker and cached overlap), exact ties at random. A class of
        a few workers is read worker by worker; a larger one (a prefix most workers hold)
        by the fleet's cheapest-first order, up to its first member."""
        order = self._by_base
        best = float("inf")
        tied: list[tuple[int, int]] = []
        for credit, depth, mask in classes:
            if mask.bit_count() <= 4:
                workers = workers_of(mask)
                m = min(map(base.__getitem__, workers))
                ties = [(depth, w) for w in workers if base[w] == m]
            else:
                i = 0
                while not mask >> order[i] & 1:
                    i += 1
                m = base[order[i]]
                ties = []
                for w in order[i:]:
                    if base[w] != m:
                        break
                    if mask >> w & 1:
                        ties.append((depth, w))
            lo = m - credit
            if lo < best:
                best, tied = lo, ties
            elif lo == best:
                tied += ties
        depth, w = tied[0] if len(tied) == 1 else self.rng.choice(sorted(tied, key=lambda x: x[1]))
        return w, depth

    def _select(self, costs: list[float]) -> int:
        lo = min(costs)
        if self.temperature <= 0:
            tied = [w for w, c in enumerate(costs) if c == lo]
            return tied[0] if len(tied) == 1 else self.rng.choice(tied)
        hi = max(costs)
        span = (hi - lo) or 1.0
        weights = [math.exp(-((c - lo) / span) / self.temperature) for c in costs]
        return self.rng.choices(range(self.n), weights)[0]

    def stored(self, worker: int, content: list[int], blind: list[int], now: float) -> None:
        if self.events:
            self.index.add(worker, content)

    def removed(self, worker: int, content: int, blind: int) -> None:
        if self.events:
            self.index.remove(worker, content)

    def routed(self, worker: int, p: Prompt, keys: tuple[int, ...], now: float) -> None:
        if not self.events:
            self.approx.add(worker, keys, now)
        held = self.in_flight[worker]
        masks = self.in_flight_index.holders
        bit = 1 << worker
        for k in keys:
            n = held.get(k)
            if n is None:
                held[k] = 1
                masks[k] = masks.get(k, 0) | bit
            else:
                held[k] = n + 1
        if p.tokens % self.block_size:
            self.padded[worker] += 1

    def finished(self, worker: int, p: Prompt, keys: tuple[int, ...]) -> None:
        held = self.in_flight[worker]
        masks = self.in_flight_index.holders
        clear = ~(1 << worker)
        for k in keys:
            n = held[k]
            if n > 1:
                held[k] = n - 1
            else:
                del held[k]
                m = masks[k] & clear
                if m:
                    masks[k] = m
                else:
                    del masks[k]
        if p.tokens % self.block_size:
            self.padded[worker] -= 1
