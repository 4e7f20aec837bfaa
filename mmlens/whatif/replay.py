"""The replay core: a recorded workload through one scenario's policy model and engine
caches, in arrival order, with each request's prefill end and completion taken from its
recording (KV events reach the router when the prefill ends).

Per request it gives the worker chosen, the router's branch, the blocks the router believed
cached there, the blocks the engine really had (``hit``) and the most any worker had
(``best``). Timing is the recording's: a request in another configuration would prefill
faster or slower; that is not modelled (nor queueing at the engines)."""

from __future__ import annotations

import heapq
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from mmlens.whatif.blocks import Prompt, prompt
from mmlens.whatif.engine import Admission, EngineCache
from mmlens.whatif.policies.base import Loads, Policy
from mmlens.whatif.scenario import Scenario
from mmlens.whatif.workload import RecordedRequest

_COMMIT, _RELEASE = 0, 1


@dataclass(slots=True)
class Run:
    """One scenario's outcome, request by request (index into ``requests``)."""

    scenario: Scenario
    requests: list[RecordedRequest]
    prompts: list[Prompt]
    worker: list[int] = field(default_factory=list)
    branch: list[str] = field(default_factory=list)
    predicted: list[int] = field(default_factory=list)
    hit: list[int] = field(default_factory=list)
    best: list[int] = field(default_factory=list)
    skipped: int = 0  # requests with no known prompt length: not modelled
    evictions: int = 0
    view: str = "content"  # the prompt view the policy routed on (``Prompt.view``)


def _decode_step(workload: Sequence[RecordedRequest]) -> float:
    """Seconds per output token: the median of the streamed requests' (latency − TTFT) per
    token after the first; with none, the slope of latency over output tokens (least squares
    over the requests that have both); 0 when neither can be told."""
    steps = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in workload
             if r.latency_s is not None and r.ttft_s is not None and (r.output_tokens or 0) > 1]
    if steps:
        return max(statistics.median(steps), 0.0)
    pts = [(r.output_tokens, r.latency_s) for r in workload
           if r.latency_s is not None and r.output_tokens is not None]
    if len(pts) < 3 or len({o for o, _ in pts}) < 2:
        return 0.0
    return max(statistics.linear_regression([o for o, _ in pts], [t for _, t in pts]).slope,
               0.0)


def _prefill_ends(workload: Sequence[RecordedRequest]) -> list[tuple[float, float]]:
    """Per request, (prefill end, completion) after its arrival. A request not streamed has
    no TTFT: its prefill ends at its latency less its output's decode steps
    (``_decode_step``), so its blocks are not held back from the requests that follow it
    for its whole latency. Unknown latencies take the workload's median."""
    step = _decode_step(workload)
    ends = [(r.ttft_s if r.ttft_s is not None else
             None if r.latency_s is None else
             min(max(r.latency_s - step * (r.output_tokens or 0), 0.0), r.latency_s),
             r.latency_s) for r in workload]
    known_ttft = [t for t, _ in ends if t is not None]
    known_lat = [t for _, t in ends if t is not None]
    ttft = statistics.median(known_ttft) if known_ttft else 0.0
    latency = statistics.median(known_lat) if known_lat else ttft
    out = []
    for t, lat in ends:
        t = ttft if t is None else t
        out.append((t, max(latency if lat is None else lat, t)))
    return out


def run(workload: Sequence[RecordedRequest], scenario: Scenario) -> Run:
    bs = scenario.block_size
    policy = scenario.build()
    n = scenario.workers
    loads = Loads(n)
    holders: dict[int, int] = {}  # content key → workers caching it (the best available)

    def evicted(w: int, key: int, blind: int) -> None:
        left = holders[key] - 1
        if left:
            holders[key] = left
        else:
            del holders[key]
        policy.removed(w, key, blind)

    engines = [EngineCache(w, scenario.capacity_blocks, evicted) for w in range(n)]
    requests, prompts = [], []
    skipped = 0
    anchored = policy.view == "unexpanded"
    for r in workload:
        p = prompt(r, bs, anchored) if r.ok else None
        if p is None:
            skipped += 1
            continue
        requests.append(r)
        prompts.append(p)
    out = Run(scenario, requests, prompts, skipped=skipped, view=policy.view)
    timing = _prefill_ends(requests)
    answers = Counter(p.answer for p in prompts)  # an answer no other request shares: one entry
    heap: list[tuple[float, int, int, int]] = []
    admissions: list[Admission | None] = [None] * len(requests)
    seq = 0
    view = policy.view
    events = policy.events
    worker_out, branch_out, pred_out = out.worker, out.branch, out.predicted
    hit_out, best_out = out.hit, out.best
    tracks = type(policy).finished is not Policy.finished  # told of each request's end
    prefilled, finish = loads.prefilled, loads.finish
    infinity = float("inf")
    n_requests = len(requests)
    i = 0
    while True:
        now = requests[i].ts if i < n_requests else infinity
        while heap and heap[0][0] <= now:
            t, _, kind, j = heapq.heappop(heap)
            a = admissions[j]
            assert a is not None
            q = prompts[j]
            w = a.worker
            if kind == _COMMIT:
                stored, stored_blind = engines[w].commit(a)
                for key in stored:
                    holders[key] = holders.get(key, 0) + 1
                if events and stored:
                    policy.stored(w, stored, stored_blind, t)
                prefilled(w, q.tokens - a.hit_blocks * bs)
            else:
                engines[w].release(a)
                finish(w)
                if tracks:
                    policy.finished(w, q, q.view(view))
                admissions[j] = None
        if i == n_requests:
            break
        p = prompts[i]
        keys = p.content if view == "content" else (p.blind if view == "blind"
                                                     else p.unexpanded)
        choice = policy.choose(p, keys, now, loads)
        w = choice.worker
        policy.routed(w, p, keys, now)
        best = 0
        for key in p.content[:max(p.tokens - 1, 0) // bs]:
            if key not in holders:
                break
            best += 1
        a = engines[w].admit(p.content, p.blind, p.tokens, p.output, bs,
                             p.answer if answers[p.answer] > 1 else None)
        admissions[i] = a
        loads.start(w, p.tokens - a.hit_blocks * bs)
        ttft, latency = timing[i]
        heapq.heappush(heap, (now + ttft, seq, _COMMIT, i))
        heapq.heappush(heap, (now + latency, seq + 1, _RELEASE, i))
        seq += 2
        worker_out.append(w)
        branch_out.append(choice.branch)
        pred_out.append(choice.predicted_blocks)
        hit_out.append(a.hit_blocks)
        best_out.append(max(best, a.hit_blocks))
        i += 1
    out.evictions = sum(e.evictions for e in engines)
    return out
