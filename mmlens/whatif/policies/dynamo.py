"""Dynamo 1.6.1's KV router (frontend ``--router-mode kv``).

Per worker: ``cost = prefill_load_scale × max(raw_prefill_blocks − credit × overlap, 0)
+ decode_blocks + decode_active_request_weight × active requests``, with
``raw_prefill_blocks = (active prefill tokens + prompt tokens) / block_size`` and
``decode_blocks`` the blocks of the worker's requests in flight. Lowest cost wins, exact ties
at random; with ``router_temperature`` > 0, a softmax over the costs normalized to [0, 1].

Its view of a request: with exact MM routing (Qwen3-VL, Kimi) each image's run carries a
per-image pad value from its mm_hash, so blocks key on content (the ``content`` view); for
families it does not support (GLM-5.3-Flash) it falls back to the rendered text with one
placeholder per image (``text_prefix``: the ``unexpanded`` view, which matches the engines'
blocks only before the first image). Overlap comes from the engines' KV events, or with
``kv_events`` off (``--no-router-kv-events``) from its own decisions, each block kept
``router_ttl_secs`` after it was last routed.

Defaults are 1.6.1's (``python -m dynamo.frontend --help``): credit 1.0, prefill load scale
1.0, temperature 0, decay 0, decode request weight 0, KV events on, TTL 120 s. Not modelled:
host/disk cache tiers (no offload in the engines modelled), the busy thresholds (unset by
default), the router queue (off by default), ``overlap_score_credit_decay``, output-block
tracking (off by default), and the optional BOS of the routing ids.
"""

from __future__ import annotations

import math
from itertools import compress

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
        self._base: list[float] = []

    def choose(self, p: Prompt, keys: tuple[int, ...], now: float, loads: Loads) -> Choice:
        base = self._base_costs(loads)
        own = self.scale * p.tokens / self.block_size
        if self.temperature > 0 or self.credit > 1:
            groups = (self.index.groups(keys) if self.events
                      else self.approx.groups(keys, now))
            overlaps = {w: d for d, ws in groups for w in ws}
            costs = [own + b for b in base]
            for w, ov in overlaps.items():
                costs[w] = self._cost(w, ov, p.tokens, loads)
            w = self._select(costs)
            depth = overlaps.get(w, 0)
        else:
            masks = (self.index.group_masks(keys) if self.events
                     else self.approx.group_masks(keys, now))
            w, depth = self._lowest(base, masks, own)
        return Choice(w, "overlap" if depth else "no_overlap", depth)

    def _cost(self, w: int, overlap: int, isl: int, loads: Loads) -> float:
        """The formula whole (its clamp at 0 bites only with a credit over 1)."""
        return (self.scale * max((loads.prefill_tokens[w] + isl) / self.block_size
                                 - self.credit * overlap, 0.0)
                + loads.active_blocks[w] + self.request_weight * loads.inflight[w])

    def _base_costs(self, loads: Loads) -> list[float]:
        """Per worker, its cost without the request's own prompt and overlap (kept up to date
        for the workers whose load changed: the fleet's other workers cost the same)."""
        if loads.touched is None or len(self._base) != self.n:
            loads.touched = set(range(self.n))
            self._base = [0.0] * self.n
        bs, scale, weight = self.block_size, self.scale, self.request_weight
        base = self._base
        for w in loads.touched:
            base[w] = (scale * loads.prefill_tokens[w] / bs + loads.active_blocks[w]
                       + weight * loads.inflight[w])
        loads.touched.clear()
        return base

    def _lowest(self, base: list[float], groups: list[tuple[int, int]], own: float,
                ) -> tuple[int, int]:
        """The lowest cost (its worker and overlap), exact ties at random; ``groups`` are
        (overlap depth, mask of the workers matched that deep). With a credit of at most 1
        the clamp never bites (an overlap is at most the prompt), so a worker costs
        ``own + base − scale × credit × overlap``: per overlap depth only its cheapest
        workers can win, and among the rest the cheapest base. A group holding one of the
        fleet's cheapest workers (the common case: a prefix every worker has) is costed
        from those alone."""
        step = self.scale * self.credit
        lo_all = min(base)
        cheapest = list(compress(range(self.n), map(lo_all.__eq__, base)))
        seen = 0
        best = float("inf")
        tied: list[tuple[int, int]] = []
        for depth, mask in groups:
            seen |= mask
            if not mask & (mask - 1):
                w = mask.bit_length() - 1
                m, ties = base[w], [(depth, w)]
            else:
                ties = [(depth, w) for w in cheapest if mask >> w & 1]
                if ties:
                    m = lo_all
                else:
                    workers = workers_of(mask)
                    m = min(map(base.__getitem__, workers))
                    ties = [(depth, w) for w in workers if base[w] == m]
            lo = m - step * depth
            if lo < best:
                best, tied = lo, ties
            elif lo == best:
                tied += ties
        if seen != (1 << self.n) - 1 and lo_all <= best:
            plain = [w for w in cheapest if not seen >> w & 1]
            lo = lo_all
            if not plain:
                lo = min(b for w, b in enumerate(base) if not seen >> w & 1)
                plain = [w for w, b in enumerate(base) if b == lo and not seen >> w & 1]
            if lo < best:
                tied = [(0, w) for w in plain]
            elif lo == best:
                tied += [(0, w) for w in plain]
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

    def routed(self, worker: int, keys: tuple[int, ...], now: float) -> None:
        if not self.events:
            self.approx.add(worker, keys, now)
