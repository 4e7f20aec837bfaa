"""Several scenarios over one recorded window, side by side with the recording: the baseline
(the recorded configuration) is replayed first, and its distance from what was measured is
kept beside every scenario's figures (the model's own error)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mmlens.records import MetricSample
from mmlens.whatif.replay import run
from mmlens.whatif.report import (
    Figures,
    ScenarioReport,
    agreement,
    error_of,
    recorded_figures,
    recorded_minutes,
    summarize,
)
from mmlens.whatif.scenario import Scenario, baseline, recorded_workers
from mmlens.whatif.workload import RecordedRequest, missing_counts


def recorded_capacity(samples: Iterable[MetricSample]) -> int | None:
    """The engines' capacity in blocks, from their ``vllm:cache_config_info`` (the smallest
    when they differ; None when no worker exported it)."""
    found = []
    for s in samples:
        if s.name == "vllm:cache_config_info":
            try:
                found.append(int(s.label("num_gpu_blocks")))
            except ValueError:
                continue
    return min(found) if found else None


@dataclass(slots=True)
class Comparison:
    workload: list[RecordedRequest]
    workers: list[str]
    measured: Figures
    measured_minutes: dict[float, Figures]
    baseline: ScenarioReport
    scenarios: list[ScenarioReport]
    error: dict[str, float | None]

    def as_json(self) -> dict[str, Any]:
        return {
            "requests": len(self.workload), "workers": self.workers,
            "missing": missing_counts(self.workload),
            "recorded": self.measured.as_json(),
            "recorded_minutes": [{"minute": m, **f.as_json()}
                                 for m, f in self.measured_minutes.items()],
            "baseline": self.baseline.as_json(),
            "baseline_error": self.error,
            "scenarios": [s.as_json() for s in self.scenarios],
        }


def compare(workload: Sequence[RecordedRequest], scenarios: Sequence[Scenario], *,
            capacity_blocks: int, block_size: int | None = None) -> Comparison:
    """``capacity_blocks``: the recorded engines' capacity (the baseline's)."""
    reqs = list(workload)
    workers = recorded_workers(reqs)
    base = baseline(reqs, capacity_blocks=capacity_blocks, block_size=block_size)
    base_run = run(reqs, base)
    # The recording over the requests the models replay (a request of unknown prompt length
    # is not modelled), so that every figure beside it covers the same requests.
    modelled = {r.request_id for r in base_run.requests}
    same = [r for r in reqs if r.request_id in modelled]
    measured = recorded_figures(same, workers)
    base_report = summarize(base_run, workers, measured)
    base_report.worker_agreement = agreement(base_run, workers)
    reports = [summarize(run(reqs, s), workers, measured) for s in scenarios]
    return Comparison(reqs, workers, measured, recorded_minutes(same, workers), base_report,
                      reports, error_of(base_report.total, measured))
