"""What a replayed scenario comes to, in the dashboard's terms, beside what was recorded.

Per scenario, over the requests it could model: the token-weighted hit rate (cached prompt
tokens / prompt tokens), false-hit tokens (blocks the router believed the chosen worker held
that its engine did not), avoidable tokens (the most any worker held, minus what the chosen
one had), per-worker load (requests and prefill tokens) and its spread (max / mean of the
prefill tokens), the prefill tokens saved against the recording, and the requests per
verdict, in the vocabulary of ``mmlens.analysis.judgement.vocabulary``.

The recorded figures are measured on the same requests: cached tokens as the engines
reported them, the stored verdicts. ``compare`` puts the baseline scenario's distance from
them beside every figure: the model's own error.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mmlens.analysis.judgement.vocabulary import CATEGORIES
from mmlens.whatif.replay import Run
from mmlens.whatif.workload import RecordedRequest

MINUTE = 60.0
SPILL_BRANCHES = frozenset({"spill"})


def verdict_of(run: Run, i: int) -> str:
    """A modelled request's verdict: why it hit or missed in this scenario."""
    hit, pred, best = run.hit[i], run.predicted[i], run.best[i]
    if run.branch[i] in SPILL_BRANCHES and best > hit:
        return "spilled"
    if pred > hit:
        return "false_hit"
    if hit:
        return "hit"
    if not best:
        return "cold"
    if run.prompts[i].first_image is not None and run.view == "unexpanded":
        return "fallback"  # routed on the text before the images only
    return "unexplained"  # a worker held some of it; the policy did not follow it


@dataclass(slots=True)
class Figures:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    false_hit_tokens: int | None = 0  # None: not measured (a recording's)
    avoidable_tokens: int | None = 0
    prefill_tokens: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    worker_requests: dict[str, int] = field(default_factory=dict)
    worker_prefill_tokens: dict[str, int] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def spread(self) -> float | None:
        """Max over mean of the per-worker prefill tokens (1.0: perfectly even)."""
        loads = list(self.worker_prefill_tokens.values())
        if not loads or not sum(loads):
            return None
        return max(loads) / (sum(loads) / len(loads))

    def as_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "hit_rate": self.hit_rate,
                "false_hit_tokens": self.false_hit_tokens,
                "avoidable_tokens": self.avoidable_tokens,
                "prefill_tokens": self.prefill_tokens, "spread": self.spread,
                "verdicts": {k: v for k, v in self.verdicts.items() if v},
                "worker_requests": self.worker_requests,
                "worker_prefill_tokens": self.worker_prefill_tokens}


def worker_names(run: Run, recorded: Sequence[str]) -> list[str]:
    """The recorded names when the scenario has as many workers, else w0, w1, …"""
    n = run.scenario.workers
    return list(recorded) if len(recorded) == n else [f"w{i}" for i in range(n)]


def _figures(run: Run, indices: Sequence[int], names: Sequence[str]) -> Figures:
    f = Figures(verdicts=dict.fromkeys(CATEGORIES, 0),
                worker_requests=dict.fromkeys(names, 0),
                worker_prefill_tokens=dict.fromkeys(names, 0))
    bs = run.scenario.block_size
    fh = av = 0
    for i in indices:
        p = run.prompts[i]
        cached = run.hit[i] * bs
        name = names[run.worker[i]]
        f.requests += 1
        f.prompt_tokens += p.tokens
        f.cached_tokens += cached
        fh += max(run.predicted[i] - run.hit[i], 0)
        av += max(run.best[i] - run.hit[i], 0)
        f.prefill_tokens += p.tokens - cached
        f.worker_requests[name] += 1
        f.worker_prefill_tokens[name] += p.tokens - cached
        f.verdicts[verdict_of(run, i)] += 1
    f.false_hit_tokens, f.avoidable_tokens = fh * bs, av * bs
    return f


def recorded_figures(requests: Sequence[RecordedRequest], recorded: Sequence[str],
                     ) -> Figures:
    """What was measured, over the requests whose prompt and cached tokens were reported
    (false-hit and avoidable tokens are the models' own: the recording has verdicts)."""
    f = Figures(false_hit_tokens=None, avoidable_tokens=None,
                verdicts=dict.fromkeys(CATEGORIES, 0),
                worker_requests=dict.fromkeys(recorded, 0),
                worker_prefill_tokens=dict.fromkeys(recorded, 0))
    for r in requests:
        if r.prompt_tokens is None or r.cached_tokens is None:
            continue
        f.requests += 1
        f.prompt_tokens += r.prompt_tokens
        f.cached_tokens += r.cached_tokens
        f.prefill_tokens += r.prompt_tokens - r.cached_tokens
        if r.worker in f.worker_requests:
            f.worker_requests[r.worker] += 1
            f.worker_prefill_tokens[r.worker] += r.prompt_tokens - r.cached_tokens
        if r.verdict is not None:
            f.verdicts[r.verdict] = f.verdicts.get(r.verdict, 0) + 1
    return f


def measured_indices(run: Run) -> list[int]:
    """The modelled requests the recording measured (prompt and cached tokens known): the
    figures beside the recording's are taken over these only."""
    return [i for i, r in enumerate(run.requests)
            if r.prompt_tokens is not None and r.cached_tokens is not None]


@dataclass(slots=True)
class ScenarioReport:
    run: Run
    total: Figures
    minutes: dict[float, Figures]
    saving_tokens: int | None  # prefill tokens saved vs the recording (None: nothing measured)
    worker_agreement: float | None = None  # baseline only: share routed as recorded

    def as_json(self) -> dict[str, Any]:
        return {"scenario": self.run.scenario.as_json(), "modelled": len(self.run.requests),
                "skipped": self.run.skipped, "evictions": self.run.evictions,
                "synthetic_keys": sum(p.synthetic for p in self.run.prompts),
                "total": self.total.as_json(), "saving_tokens": self.saving_tokens,
                "worker_agreement": self.worker_agreement,
                "minutes": [{"minute": m, **f.as_json()} for m, f in self.minutes.items()]}


def summarize(run: Run, recorded: Sequence[str], measured: Figures | None,
              ) -> ScenarioReport:
    names = worker_names(run, recorded)
    idx = measured_indices(run) if measured is not None and measured.requests else list(
        range(len(run.requests)))
    total = _figures(run, idx, names)
    by_minute: dict[float, list[int]] = {}
    for i in idx:
        by_minute.setdefault(run.requests[i].ts // MINUTE * MINUTE, []).append(i)
    minutes = {m: _figures(run, by_minute[m], names) for m in sorted(by_minute)}
    saving = (measured.prefill_tokens - total.prefill_tokens
              if measured is not None and measured.requests else None)
    return ScenarioReport(run, total, minutes, saving)


def agreement(run: Run, recorded: Sequence[str]) -> float | None:
    """How often the baseline chose the worker the recording shows (None: not comparable)."""
    names = worker_names(run, recorded)
    pairs = [(names[w], r.worker) for w, r in zip(run.worker, run.requests, strict=True)
             if r.worker is not None]
    if not pairs or names != list(recorded):
        return None
    return sum(a == b for a, b in pairs) / len(pairs)


def recorded_minutes(requests: Sequence[RecordedRequest], recorded: Sequence[str],
                     ) -> dict[float, Figures]:
    by_minute: dict[float, list[RecordedRequest]] = {}
    for r in requests:
        by_minute.setdefault(r.ts // MINUTE * MINUTE, []).append(r)
    return {m: recorded_figures(by_minute[m], recorded) for m in sorted(by_minute)}


FIGURES = ("hit_rate", "cached_tokens", "false_hit_tokens", "avoidable_tokens",
           "prefill_tokens", "spread")


def error_of(baseline: Figures, measured: Figures) -> dict[str, float | None]:
    """The baseline model's distance from the measurement, per figure (model − measured)."""
    out: dict[str, float | None] = {}
    for name in FIGURES:
        b, m = getattr(baseline, name), getattr(measured, name)
        out[name] = None if b is None or m is None else b - m
    return out


def verdict_counts(run: Run) -> Counter[str]:
    return Counter(verdict_of(run, i) for i in range(len(run.requests)))
