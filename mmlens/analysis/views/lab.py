"""The Lab page's view: configured routers and the mode each runs in, its inputs checked one by
one, each step's result with its verdict, and router mode against worker mode."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mmlens.analysis.decisions import merged
from mmlens.analysis.judgement.shown import category, headline
from mmlens.analysis.lab_plan import NEEDS, SEQUENCES, PlannedStep, StepResult, parse_sizes
from mmlens.analysis.request_view import predicted_tokens
from mmlens.analysis.routing_table import overlap_text
from mmlens.analysis.views.common import named_headline, worker_label
from mmlens.analysis.views.routing import MODE_SERIES
from mmlens.ingest.metric_series import SeriesIndex, to_series
from mmlens.ingest.metrics_smg import MM_PROCESSING_LABELS as MODE_LABELS
from mmlens.records import MetricSample, RequestTrace, Verdict

_URL = re.compile(r"^(https?://[^\s/:]+(:\d{1,5})?(/\S*)?|data:image/[\w.+-]+;base64,\S+)$")


def routers(targets: dict[str, Any] | None) -> list[dict[str, Any]]:
    return list((targets or {}).get("routers") or [])


def models_of(states: list[dict[str, Any]] | None, router_name: str) -> list[str]:
    for s in states or []:
        if s.get("router") == router_name:
            return list(s.get("models") or [])
    return []


def router_modes(mm_processing: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Per router target, the processing mode it used most (``smg_mm_processing_total``)."""
    best: dict[str, tuple[float, str]] = {}
    for row in mm_processing:
        target, mode, count = row.get("target"), row.get("mode"), float(row.get("count") or 0)
        if target and mode and count > best.get(target, (0.0, ""))[0]:
            best[target] = (count, str(mode))
    return {t: mode for t, (_, mode) in best.items()}


def modes_of_samples(samples: Iterable[MetricSample]) -> dict[str, str]:
    """``router_modes`` of the ``smg_mm_processing_total`` rows the routers' normalization
    makes (``metrics_smg``), from that one series' samples: what the Lab needs of the
    routers' metrics."""
    rows = SeriesIndex(to_series(samples)).counter_rows(MODE_SERIES, MODE_LABELS)
    return router_modes(rows)


# --- inputs ----------------------------------------------------------------------------------


@dataclass
class LabInputs:
    """The Lab's inputs once checked: each bad one has a message under its field."""

    sizes: list[tuple[int, int]] = field(default_factory=list)
    url: str | None = None
    errors: dict[str, str] = field(default_factory=dict)


def check_inputs(kind: str, sizes: str, count: int, url: str, sequence: str,
                 uploads: int) -> LabInputs:
    """Sizes parse, the URL is one a router can fetch, the sequence has its images; the
    layout model is checked by the page (it resolves the model)."""
    out = LabInputs()
    if kind != "none" and count:
        try:
            out.sizes = parse_sizes(sizes)
        except ValueError as exc:
            out.errors["sizes"] = f"{exc} (write sizes as WxH, comma-separated: 480x360, 640x480)"
    url = url.strip()
    if url:
        if _URL.match(url):
            out.url = url
        else:
            out.errors["url"] = (f"not an image URL: {url[:60]!r} (http://host/path, "
                                 "https://…, or data:image/png;base64,…)")
    have = (count if kind != "none" else 0) + uploads + (1 if out.url else 0)
    need = NEEDS.get(sequence, 0)
    if not sequence.startswith("scenario:") and have < need:
        out.errors["sequence"] = (f"{SEQUENCES[sequence].split(' (')[0]} needs {need} images: "
                                  f"{have} given (raise How many, or upload)")
    return out


# --- results ---------------------------------------------------------------------------------


def step_result(step: PlannedStep[Any], router: str, trace: RequestTrace,
                names: Mapping[str, str] | None = None, mode: str | None = None,
                verdict: Verdict | None = None) -> StepResult:
    """One step's row: worker by its config name, the stored verdict (pending until the
    collector judged it) and its one-line reason."""
    view = merged(trace.predictions)
    lay = trace.expected_layout
    extra: dict[str, object] = {
        "overlap": overlap_text(view), "branch": view.branch or "—",
        "router_view": lay.router_view.token_count if lay and lay.router_view else None,
        "worker_view": lay.worker_view.token_count if lay and lay.worker_view else None,
        "expected_engine": lay.engine_prompt_tokens if lay else None,
    }
    return StepResult(
        step=step.label, router=router, request=trace.request_id, key=step.key,
        worker=worker_label(trace.worker, names), prompt_tokens=trace.prompt_tokens,
        cached_tokens=trace.cached_tokens, predicted=predicted_tokens(trace),
        ttft_ms=None if trace.ttft_s is None else round(trace.ttft_s * 1000, 1),
        verdict=category(verdict),
        why=(f"failed: {trace.error_code or trace.status}: {trace.error}" if trace.error
             else named_headline(headline(verdict), trace.worker, names)),
        mode=mode or trace.processing_mode or "—",
        error=f"{trace.error_code}: {trace.error}" if trace.error else "", extra=extra,
        latency_ms=None if trace.latency_s is None else round(trace.latency_s * 1000, 1))


def judged(results: Sequence[StepResult], verdicts: Mapping[str, Verdict],
           names: Mapping[str, str] | None = None) -> list[StepResult]:
    """The results with the stored verdicts read since they were sent."""
    out = []
    for r in results:
        v = verdicts.get(r.request)
        out.append(r if v is None else replace(
            r, verdict=v.category, why=named_headline(v.headline, v.worker, names)))
    return out


@dataclass
class ModeComparison:
    """One step sent through routers in different processing modes."""

    step: str
    rows: list[dict[str, Any]]
    notes: list[str]


def compare_modes(results: Sequence[StepResult]) -> list[ModeComparison]:
    """Per step sent through more than one router: what each router routed on and what each
    engine counted and found cached, and every difference explained."""
    by_step: dict[str, list[StepResult]] = {}
    for r in results:
        by_step.setdefault(r.step, []).append(r)
    out = []
    for step, rs in by_step.items():
        if len({r.router for r in rs}) < 2:
            continue
        rows = [{
            "router": r.router, "mode": r.mode, "worker": r.worker,
            "router routed on (tokens)": r.extra.get("worker_view") if r.mode == "worker"
            else r.extra.get("router_view"),
            "router's overlap": r.extra.get("overlap"), "branch": r.extra.get("branch"),
            "engine prompt_tokens (observed)": r.prompt_tokens,
            "expected prompt_tokens": r.extra.get("expected_engine"),
            "cached": r.cached_tokens, "verdict": r.verdict, "request": r.request,
        } for r in rs]
        out.append(ModeComparison(step, rows, mode_notes(rs)))
    return out


def mode_notes(rs: Sequence[StepResult]) -> list[str]:
    """Why the counts of one request differ (or agree) between the routers' modes."""
    ok = [r for r in rs if not r.error and r.prompt_tokens is not None]
    notes = ["Engine prompt_tokens observed: " + " · ".join(
        f"{r.router} ({r.mode} mode, {r.worker}) {r.prompt_tokens}" for r in ok)] if ok else []
    for r in rs:
        if r.error:
            notes.append(f"{r.router} ({r.mode} mode) failed: {r.error}")
    counts = {r.prompt_tokens for r in ok}
    if len(counts) == 1 and ok:
        notes.append(f"The engines counted {ok[0].prompt_tokens} prompt tokens in every mode: "
                     "the worker's own processor expanded each image to the count the router "
                     "computes in router mode.")
    elif len(counts) > 1:
        base = next((r for r in ok if r.mode == "router"), ok[0])
        for r in ok:
            if r is not base and r.prompt_tokens != base.prompt_tokens:
                diff = (r.prompt_tokens or 0) - (base.prompt_tokens or 0)
                notes.append(
                    f"{r.router} ({r.mode} mode): the engine counted {diff:+d} tokens against "
                    f"{base.router} ({base.mode} mode) — its processor expands the images to "
                    "another count (count drift): the blocks after the first image differ, so "
                    "cache stored in one mode cannot serve the other.")
    notes += _routing_notes(ok)
    return notes


def _routing_notes(ok: Sequence[StepResult]) -> list[str]:
    notes = []
    router = next((r for r in ok if r.mode == "router"), None)
    worker = next((r for r in ok if r.mode == "worker"), None)
    if router is None or worker is None:
        return notes
    notes.append(
        f"Routing input: in router mode SMG expanded the images and routed on "
        f"{router.extra.get('router_view') or '?'} token ids ({router.extra.get('overlap')} "
        f"blocks matched); in worker mode it routed on {worker.extra.get('worker_view') or '?'} "
        f"ids with one placeholder per image ({worker.extra.get('overlap')}), which never match "
        "the engines' expanded blocks, so the worker was picked by load "
        f"({worker.extra.get('branch')}).")
    if (router.cached_tokens or 0) > (worker.cached_tokens or 0):
        notes.append(
            f"Cache: router mode found {router.cached_tokens or 0} cached tokens, worker mode "
            f"{worker.cached_tokens or 0}: the engine keys an image by the identifier it gets "
            "— SMG's hash of the bytes in router mode, its own in worker mode — so entries "
            "stored in one mode do not serve the other (and worker mode may land elsewhere).")
    return notes
