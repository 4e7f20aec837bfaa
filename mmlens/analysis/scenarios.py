"""Scenarios: fixed request sequences that check a router's multimodal cache behaviour.

Each scenario is a plan (requests to send, images described by size and colour) and a judge:
a pure function from the traces that came back to a verdict with its evidence (the judges
are in ``scenario_judges``). Sending is the runner's business (collectors/scenario_runner.py);
nothing here touches the network.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mmlens.analysis.availability.tracker import history_summary
from mmlens.analysis.judgement.shown import category, headline
from mmlens.analysis.scenario_judges import Context as Context
from mmlens.analysis.scenario_judges import Outcome as Outcome
from mmlens.analysis.scenario_judges import Thresholds as Thresholds
from mmlens.analysis.scenario_judges import Verdict as Verdict
from mmlens.analysis.scenario_judges import (
    failed_requests,
    judge_affinity,
    judge_identity,
    judge_isolation,
    judge_parity,
    judge_repeat,
    judge_staircase,
    judge_straddle,
    predicted_blocks,
)
from mmlens.records import RequestTrace
from mmlens.records import Verdict as RequestVerdict

RGB = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class ImageSpec:
    width: int
    height: int
    color: RGB
    via: Literal["data", "url"] = "data"
    name: str = "img"  # URL path component when sent by URL


@dataclass(frozen=True, slots=True)
class RequestSpec:
    label: str
    text: str
    images: tuple[ImageSpec, ...]
    mode: Literal["default", "worker"] = "default"  # "worker": send to the worker-mode router


@dataclass
class Result:
    name: str
    verdict: Verdict
    evidence: dict[str, Any]
    requests: list[dict[str, Any]]
    summary: str = ""
    availability: dict[str, Any] = field(default_factory=dict)  # avoidable tokens, by cause

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "verdict": self.verdict, "summary": self.summary,
                "evidence": self.evidence, "requests": self.requests,
                "availability": self.availability}


Judge = Callable[[Context, Sequence[RequestTrace]], Outcome]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    requests: tuple[RequestSpec, ...]
    judge: Judge
    needs_media_server: bool = False
    needs_worker_mode_router: bool = False


PALETTE: tuple[RGB, ...] = ((210, 40, 40), (40, 60, 210), (30, 170, 60), (230, 180, 20),
                            (20, 160, 170))
TEXT = "Describe this image in detail please."


def request_row(spec: RequestSpec, trace: RequestTrace) -> dict[str, Any]:
    return {
        "label": spec.label,
        "request_id": trace.request_id,
        "images": [f"{i.width}x{i.height}" for i in spec.images],
        "worker": trace.worker,
        "status": trace.status,
        "prompt_tokens": trace.prompt_tokens,
        "cached_tokens": trace.cached_tokens,
        "predicted_overlap_blocks": predicted_blocks(trace),
        "ttft_s": trace.ttft_s,
        "latency_s": trace.latency_s,
        "error": trace.error,
        "error_code": trace.error_code,
    }


# --- plans ------------------------------------------------------------------------------


def straddling_sizes(count_of: Callable[[int, int], int], block_size: int
                     ) -> tuple[tuple[int, int], tuple[int, int]]:
    """Two sizes whose image runs are not block multiples (so runs straddle boundaries)."""
    found = []
    for side in range(96, 2048, 32):
        for w, h in ((side + 32, side), (side, side)):
            n = count_of(w, h)
            if n > 2 * block_size and n % block_size not in (0,) and (w, h) not in found:
                found.append((w, h))
                break
        if len(found) == 2:
            return found[0], found[1]
    return (640, 480), (1280, 720)


def salted(color: RGB, salt: int) -> RGB:
    """Colours shifted by a per-run salt, so a rerun against a warm cluster starts cold."""
    r, g, b = color
    return r, g, (b + salt) % 256


def build(ctx: Context, salt: int = 0) -> list[Scenario]:
    count = ctx.count_of or (lambda w, h: 64)
    s1, s2 = straddling_sizes(count, ctx.block_size)
    red, blue, green, gold, teal = (salted(c, salt) for c in PALETTE)
    a, b = ImageSpec(640, 480, red), ImageSpec(640, 480, blue)
    return [
        Scenario("repeat", "the same image request three times: warm repeats hit the cache",
                 tuple(RequestSpec(f"A#{i + 1}", TEXT, (a,)) for i in range(3)), judge_repeat),
        Scenario("affinity", "two distinct images A, B, A, B: replays return to their seeds",
                 (RequestSpec("A", TEXT, (ImageSpec(640, 480, gold),)),
                  RequestSpec("B", TEXT, (ImageSpec(640, 480, teal),)),
                  RequestSpec("A again", TEXT, (ImageSpec(640, 480, gold),)),
                  RequestSpec("B again", TEXT, (ImageSpec(640, 480, teal),))),
                 judge_affinity),
        Scenario("isolation", "warm A, then a different image B of the same size and text",
                 (RequestSpec("A", TEXT + " (isolation)", (a,)),
                  RequestSpec("B", TEXT + " (isolation)", (b,))), judge_isolation),
        Scenario("straddle", "two images whose runs straddle blocks; swap the second",
                 (RequestSpec("seed", "Compare.", (ImageSpec(*s1, green), ImageSpec(*s2, red))),
                  RequestSpec("swapped", "Compare.",
                              (ImageSpec(*s1, green), ImageSpec(*s2, blue)))), judge_straddle),
        Scenario("staircase", "1, 2, then 3 identical images: overlap climbs per image",
                 tuple(RequestSpec(f"{k} image(s)", "Count them.",
                                   tuple(ImageSpec(320, 320, gold) for _ in range(k)))
                       for k in (1, 2, 3)), judge_staircase),
        Scenario("identity", "the same bytes by data URI, by URL, and by a second URL",
                 (RequestSpec("data URI", TEXT, (ImageSpec(448, 448, teal),)),
                  RequestSpec("URL", TEXT, (ImageSpec(448, 448, teal, "url", "one.png"),)),
                  RequestSpec("other URL", TEXT,
                              (ImageSpec(448, 448, teal, "url", "two.png"),))),
                 judge_identity, needs_media_server=True),
        Scenario("parity", "mmlens' expected count vs the router's expansion vs the engine",
                 (RequestSpec("router mode", "Parity check.", (ImageSpec(1280, 720, green),)),
                  RequestSpec("worker mode", "Parity check.", (ImageSpec(1280, 720, green),),
                              mode="worker")),
                 judge_parity, needs_worker_mode_router=True),
    ]


NAMES = ("repeat", "affinity", "isolation", "straddle", "staircase", "identity", "parity")


def judge(scenario: Scenario, ctx: Context, traces: Sequence[RequestTrace],
          verdicts: Mapping[str, RequestVerdict] | None = None) -> Result:
    """``verdicts``: the stored verdict of each request (the verdict job's, run over the
    check's store after sending); a request without one shows as pending."""
    rows = [request_row(s, t) for s, t in zip(scenario.requests, traces, strict=True)]
    if not traces:
        return Result(scenario.name, "inconclusive", {}, rows, "no request was sent")
    for row, t in zip(rows, traces, strict=True):
        v = (verdicts or {}).get(t.request_id)
        row["explanation"] = f"{category(v)}: {headline(v)}"
    per_request, availability = history_summary(traces)
    for row in rows:
        a = per_request.get(row["request_id"])
        if a is not None:
            row.update(available_tokens=a.best_tokens, avoidable_tokens=a.avoidable_tokens,
                       avoidable_causes=a.causes, false_hit_tokens=a.false_hit_tokens)
    errors = failed_requests(traces)
    if errors and scenario.name != "identity":
        return Result(scenario.name, "inconclusive", {"errors": errors}, rows,
                      "requests failed: " + "; ".join(errors), availability)
    verdict, summary, evidence = scenario.judge(ctx, traces)
    return Result(scenario.name, verdict, evidence, rows, summary, availability)
