"""The Lab's request sequences, the images of a run and each step's result row (pure: images
are opaque values here, the page renders them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from mmlens.layout.imageinfo import parse_size

T = TypeVar("T")

SEQUENCES = {
    "once": "one request",
    "repeat": "repeat ×3 (cache hits should grow, then stay)",
    "abab": "A and B at once, then A again, B again (two images: each replay should find its "
            "cache on its seed's worker)",
    "isolation": "A, A, then B (two images of one size: B may be a false hit)",
    "staircase": "1, 2, 3 copies of the first image (overlap should climb)",
}
NEEDS = {"abab": 2, "isolation": 2, "staircase": 1}
MAX_IMAGES = 8
SEED = "seed"  # the verdict shown for a first send: what it found is what seeding looks like


@dataclass(frozen=True)
class PlannedStep(Generic[T]):
    label: str
    text: str
    images: list[T]
    key: str  # which images, by name ("A", "A+B"): steps with one key send the same images
    together: bool = False  # sent at the same moment as the neighbouring steps marked so


@dataclass(frozen=True)
class ImageSpec:
    """One synthetic image of a run: its own seed and tint, so no two are alike."""

    name: str
    kind: str
    width: int
    height: int
    seed: int
    rgb: tuple[int, int, int]


def tint(seed: int) -> tuple[int, int, int]:
    """A colour per seed, so images of different seeds differ in content."""
    return (seed * 37) % 256, (seed * 91 + 60) % 256, (seed * 53 + 120) % 256


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``"480x360, 640x480"`` → ``[(480, 360), (640, 480)]``; ImageError (a ValueError) on a
    bad entry, naming it."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise ValueError("give at least one size, e.g. 640x480")
    return [parse_size(s) for s in items]


def run_images(kind: str, sizes: Sequence[tuple[int, int]], count: int, seed: int,
               ) -> list[ImageSpec]:
    """``count`` images named A, B, C…: image i takes the i-th size (cycling) and seed
    ``seed + i`` (its noise and its tint)."""
    if kind == "none" or count <= 0:
        return []
    out = []
    for i in range(min(count, MAX_IMAGES)):
        w, h = sizes[i % len(sizes)]
        out.append(ImageSpec(chr(ord("A") + i), kind, w, h, seed + i, tint(seed + i)))
    return out


def plan_steps(sequence: str, images: Sequence[T], text: str,
               names: Sequence[str] | None = None) -> list[PlannedStep[T]]:
    """The steps of a sequence; ``names`` names the images (default A, B, C…)."""
    imgs = list(images)
    names = list(names or [chr(ord("A") + i) for i in range(len(imgs))])
    need = NEEDS.get(sequence, 0)
    if len(imgs) < need:
        raise ValueError(f"{SEQUENCES[sequence]}: needs {need} image(s), has {len(imgs)}")
    every = "+".join(names) or "text"
    if sequence == "once":
        return [PlannedStep("request", text, imgs, every)]
    if sequence == "repeat":
        return [PlannedStep(f"repeat {i + 1}", text, imgs, every) for i in range(3)]
    if sequence in ("abab", "isolation"):
        (a, b), (na, nb) = imgs[:2], names[:2]
        if sequence == "abab":
            return [PlannedStep(na, text, [a], na, together=True),
                    PlannedStep(nb, text, [b], nb, together=True),
                    PlannedStep(f"{na} again", text, [a], na),
                    PlannedStep(f"{nb} again", text, [b], nb)]
        return [PlannedStep(f"{na} (seed)", text, [a], na),
                PlannedStep(f"{na} (warm)", text, [a], na),
                PlannedStep(f"{nb} (other pixels)", text, [b], nb)]
    if sequence == "staircase":
        return [PlannedStep(f"{n} × {names[0]}", text, [imgs[0]] * n, "+".join([names[0]] * n))
                for n in (1, 2, 3)]
    raise ValueError(f"unknown sequence {sequence!r}")


def batches(steps: Sequence[PlannedStep[T]]) -> list[list[PlannedStep[T]]]:
    """Consecutive steps marked ``together`` form one batch; every other step is its own."""
    out: list[list[PlannedStep[T]]] = []
    for step in steps:
        if step.together and out and out[-1][0].together:
            out[-1].append(step)
        else:
            out.append([step])
    return out


@dataclass
class StepResult:
    """What one step got, as the Lab shows it."""

    step: str
    router: str
    request: str
    key: str  # which images (see PlannedStep.key)
    worker: str
    prompt_tokens: int | None
    cached_tokens: int | None
    predicted: int | None
    ttft_ms: float | None
    verdict: str
    why: str
    mode: str = "—"
    error: str = ""
    latency_ms: float | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def computed(self) -> int | None:
        if self.prompt_tokens is None:
            return None
        return self.prompt_tokens - (self.cached_tokens or 0)

    @property
    def hit(self) -> float | None:
        if not self.prompt_tokens or self.error:
            return None
        return (self.cached_tokens or 0) / self.prompt_tokens


def ttft_changes(results: Sequence[StepResult]) -> dict[int, str]:
    """Per result (by index): its TTFT against the first send of the same images to the
    same router ("−62% vs A"), or its latency's when TTFT was not measured (no stream);
    first sends and failures get none."""
    first: dict[tuple[str, str], StepResult] = {}
    out: dict[int, str] = {}
    for i, r in enumerate(results):
        base = first.get((r.router, r.key))
        if base is None:
            if not r.error:
                first[(r.router, r.key)] = r
            continue
        if r.error:
            continue
        if r.ttft_ms is not None and base.ttft_ms:
            now, then, what = r.ttft_ms, base.ttft_ms, ""
        elif r.latency_ms is not None and base.latency_ms:
            now, then, what = r.latency_ms, base.latency_ms, " (latency)"
        else:
            continue
        out[i] = f"{(now - then) / then:+.0%} vs {base.step}{what}"
    return out


def result_rows(results: Sequence[StepResult], seeds: Mapping[int, str] | None = None,
                ) -> list[dict[str, object]]:
    """The Lab's result table: per step its worker, tokens cached and computed, hit %, TTFT
    and its change, the router's prediction and the verdict with its reason; a seed (the
    first send of its images, ``seeds`` by index) is marked so, its note as the reason."""
    changes = ttft_changes(results)
    seeds = seeds or {}
    rows = []
    for i, r in enumerate(results):
        rows.append({
            "step": r.step, "router": r.router, "verdict": SEED if i in seeds else r.verdict,
            "why": seeds.get(i, r.why),
            "worker": r.worker, "prompt": r.prompt_tokens, "cached": r.cached_tokens,
            "computed": r.computed, "hit %": None if r.hit is None else round(100 * r.hit),
            "predicted": r.predicted, "TTFT ms": r.ttft_ms, "TTFT change": changes.get(i, "—"),
            "mode": r.mode, "error": r.error, "request": r.request,
        })
    return rows


def summary_line(results: Sequence[StepResult], seeds: Mapping[int, str] | None = None) -> str:
    """One line for the whole run: per step its worker, what it found cached and the
    verdict ("A → w1: 0% cached (seed) · A again → w1: 99% cached (hit)")."""
    parts = []
    routers = {r.router for r in results}
    for i, r in enumerate(results):
        where = f"{r.step}" + (f" via {r.router}" if len(routers) > 1 else "")
        got = "failed" if r.error else (
            f"{round(100 * r.hit)}% cached" if r.hit is not None else "cached ?")
        parts.append(f"{where} → {r.worker}: {got} ({SEED if i in (seeds or {}) else r.verdict})")
    return " · ".join(parts)
