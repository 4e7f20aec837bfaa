"""A generated busy cluster for judging: each worker runs the demo's vLLM-like prefix cache
(demo/prefix_cache.py) at 16 requests in flight (16 allocated before any commits, so some
compute blocks another is computing), 20 decode tokens each; requests are logged SMG
records (worker, prompt tokens, latency, a predicted overlap) without cached tokens, so
every realized hit comes from KV-chain attribution. Shared by ``benchmarks/judge_bench.py``
and the test that the fast judging path stores the same verdicts as the plain one."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

from mmlens.demo.prefix_cache import MediaSpan, PrefixCache, StoredBlocks

from mmlens.records import BlockStored, RequestTrace, RoutingDecision
from mmlens.store.base import SQLStore

BS = 16
IN_FLIGHT = 16
LOGGED = {"worker": "router_log:smg", "prompt_tokens": "router_log:smg",
          "status": "router_log:smg", "latency_s": "router_log:smg"}
KVRow = tuple[float, str, str, "str | None", list[str]]


@dataclass
class Workload:
    """``traces`` carry their logged decision as a prediction (as the job holds them once
    joined); ``rows`` are the KV rows as the job reads them from a store (ts, unit, kind,
    parent, hashes as text), ``events`` the same as engines publish them; ``truth`` each
    request's hit in blocks as the prefix cache counted it."""

    traces: list[RequestTrace] = field(default_factory=list)
    rows: list[KVRow] = field(default_factory=list)
    events: list[BlockStored] = field(default_factory=list)
    truth: dict[str, int] = field(default_factory=dict)

    def logged(self) -> tuple[list[RequestTrace], list[RoutingDecision]]:
        """The records a router-log collector stores: traces without predictions, and the
        decisions on their own (the job joins them by request id)."""
        bare = [dataclasses.replace(t, predictions=[]) for t in self.traces]
        return bare, [p for t in self.traces for p in t.predictions]

    def stored(self, store: SQLStore) -> SQLStore:
        """``store`` holding the whole workload as its collectors write it: the logged
        traces and decisions, the engines' KV events."""
        traces, decisions = self.logged()
        store.add_traces(traces)
        store.add_decisions(decisions)
        store.add_kv_events(self.events)
        return store


def workload(n: int, workers: int, seed: int = 7, t0: float = 0.0, wave_s: float = 2.0,
             num_blocks: int = 400_000) -> Workload:
    """``wave_s``: from one wave of 16 to the next on a worker (a wave runs about 0.9 s;
    below that the waves overlap and the worker is never idle). ``num_blocks``: each
    worker's cache (a few hundred requests never fill 20,000)."""
    rng = random.Random(seed)
    out = Workload()
    stamped: list[tuple[float, str, StoredBlocks]] = []
    for w in range(workers):
        unit = f"grpc://127.0.0.1:{50051 + w}"
        cache = PrefixCache(block_size=BS, num_blocks=num_blocks)
        prefixes = [[rng.randrange(1000, 5000) for _ in range(rng.choice((40, 90, 170, 330)))]
                    for _ in range(12)]
        t = t0
        for wave in range(n // workers // IN_FLIGHT):
            live = []
            for i in range(IN_FLIGHT):
                rid = f"{w}-{wave}-{i}"
                tokens = rng.choice(prefixes) + [rng.randrange(5000, 9000)
                                                 for _ in range(rng.randrange(1, 80))]
                media = [MediaSpan(f"img{rng.randrange(4)}", 5, 30)] if rng.random() < .5 else []
                events: list = []
                alloc = cache.allocate(tokens, media, events)
                out.truth[rid] = alloc.hit_blocks
                live.append((rid, t + i * 0.01, tokens, alloc, events))
            for k, (rid, start, tokens, alloc, events) in enumerate(live):
                commit = t + 0.2 + k * 0.02
                cache.commit(alloc, events)
                stamped += [(commit, unit, e) for e in events if isinstance(e, StoredBlocks)]
                more: list = []
                cache.extend(alloc, [rng.randrange(9000, 9999) for _ in range(20)], more)
                stamped += [(commit + 0.3, unit, e) for e in more if isinstance(e, StoredBlocks)]
                cache.release(alloc)
                predicted = min(len(tokens) // BS, alloc.hit_blocks + rng.choice((0, 0, 0, 3)))
                out.traces.append(RequestTrace(
                    rid, "smg", "smg", "m", start, False, worker=unit, status=200,
                    prompt_tokens=len(tokens), latency_s=commit + 0.4 - start,
                    origin="observed", sources=["router_log"], provenance=dict(LOGGED),
                    predictions=[RoutingDecision(rid, "smg", "router_log:smg", worker=unit,
                                                 branch="event_hit" if predicted else
                                                 "event_miss", overlap_blocks=predicted,
                                                 request_blocks=len(tokens) // BS,
                                                 block_size=BS, ts=start)]))
            t += wave_s
    stamped.sort(key=lambda s: s[0])
    seqs: dict[str, int] = {}
    for ts, unit, e in stamped:
        parent = e.parent_block_hash
        out.rows.append((ts, unit, "stored", None if parent is None else str(parent),
                         [str(h) for h in e.block_hashes]))
        seq = seqs[unit] = seqs.get(unit, -1) + 1
        out.events.append(BlockStored(unit, 0, seq, ts, list(e.block_hashes), parent,
                                      list(e.token_ids), BS))
    out.traces.sort(key=lambda t: t.ts)
    return out
