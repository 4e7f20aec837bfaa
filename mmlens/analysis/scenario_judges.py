"""The scenarios' judges: pure functions from the traces a scenario's requests came back with
(and a Context) to a verdict, a one-line summary and the evidence behind it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mmlens.records import ExpectedLayout, RequestTrace

Verdict = Literal["pass", "fail", "inconclusive"]
Outcome = tuple[Verdict, str, dict[str, Any]]
"""A judge's answer: the verdict, a one-line summary, the evidence behind it."""


@dataclass(frozen=True)
class Thresholds:
    warm_fraction: float = 0.5  # a warm request caches more than this share of its prompt
    staircase_slack_blocks: int = 3  # per-image increments may differ by this many blocks
    straddle_min_blocks: int = 1


@dataclass(frozen=True)
class Context:
    """What a judge knows besides the traces."""

    block_size: int
    model_family: str
    thresholds: Thresholds = field(default_factory=Thresholds)
    count_of: Callable[[int, int], int] | None = None  # image-token count from the core


def predicted_blocks(trace: RequestTrace) -> int | None:
    for p in trace.predictions:
        if p.overlap_blocks is not None:
            return p.overlap_blocks
    return None


def failed_requests(traces: Sequence[RequestTrace]) -> list[str]:
    return [f"{t.request_id}: {t.error_code or t.status}: {t.error}" for t in traces
            if t.error or (t.status or 0) >= 400]


def layout_of(trace: RequestTrace) -> ExpectedLayout | None:
    lay = trace.expected_layout
    return lay if lay is not None and lay.ok else None


def image_starts(trace: RequestTrace) -> list[int]:
    lay = layout_of(trace)
    if lay is None:
        return []
    starts: dict[int, int] = {}
    for span in lay.spans:
        if span.kind == "image" and span.image_index is not None:
            starts.setdefault(span.image_index, span.start)
    return [starts[i] for i in sorted(starts)]


# --- judges -----------------------------------------------------------------------------


def judge_repeat(ctx: Context, traces: Sequence[RequestTrace]) -> Outcome:
    cached = [t.cached_tokens for t in traces]
    prompt = traces[-1].prompt_tokens or 0
    workers = [t.worker for t in traces]
    warm = traces[1]
    ev = {"cached_tokens": cached, "prompt_tokens": [t.prompt_tokens for t in traces],
          "workers": workers}
    threshold = int((warm.prompt_tokens or 0) * ctx.thresholds.warm_fraction)
    ok_warm = warm.cached_tokens > threshold
    ok_stay = cached[2] >= cached[1] and cached[1] >= cached[0]
    ev["warm_threshold"] = threshold
    if ok_warm and ok_stay:
        return "pass", (f"warm repeats cached {cached[1]} and {cached[2]} of {prompt} tokens "
                        f"on {workers[1]}"), ev
    why = []
    if not ok_warm:
        why.append(f"the first repeat cached {warm.cached_tokens} tokens, not more than "
                   f"{threshold} ({ctx.thresholds.warm_fraction:.0%} of its prompt)")
    if not ok_stay:
        why.append(f"cached tokens fell between repeats: {cached}")
    if len(set(workers)) > 1:
        why.append(f"the repeats went to different workers: {workers}")
    return "fail", "; ".join(why), ev


def judge_affinity(ctx: Context, traces: Sequence[RequestTrace]) -> Outcome:
    a1, b1, a2, b2 = traces
    ev = {"seed_workers": {"A": a1.worker, "B": b1.worker},
          "replay_workers": {"A": a2.worker, "B": b2.worker},
          "replay_cached": {"A": a2.cached_tokens, "B": b2.cached_tokens}}
    ev["seeds_on_one_worker"] = a1.worker == b1.worker
    back = a2.worker == a1.worker and b2.worker == b1.worker
    note = " (both seeds landed on one worker, so this shows stickiness, not spread)" \
        if ev["seeds_on_one_worker"] else ""
    if back:
        return "pass", f"each replay returned to its seed worker{note}", ev
    return "fail", (f"replays left their seed workers: A {a1.worker}→{a2.worker}, "
                    f"B {b1.worker}→{b2.worker}"), ev


def text_prefix_tokens(trace: RequestTrace) -> int | None:
    starts = image_starts(trace)
    return starts[0] if starts else None


def judge_isolation(ctx: Context, traces: Sequence[RequestTrace]) -> Outcome:
    a, b = traces
    prefix = text_prefix_tokens(b)
    bs = ctx.block_size
    limit = None if prefix is None else (prefix // bs) * bs
    predicted = predicted_blocks(b)
    false_hit = (predicted is not None and b.worker == a.worker
                 and predicted * bs > (b.cached_tokens or 0) + bs)
    ev = {"text_prefix_tokens": prefix, "cacheable_prefix_tokens": limit,
          "b_cached_tokens": b.cached_tokens, "b_prompt_tokens": b.prompt_tokens,
          "a_worker": a.worker, "b_worker": b.worker,
          "router_predicted_overlap_blocks": predicted,
          "content_blind_false_hit": false_hit}
    if limit is None:
        return "inconclusive", "no expected layout to find the text prefix", ev
    if b.cached_tokens > limit:
        return "fail", (f"B (another image) cached {b.cached_tokens} tokens, more than the "
                        f"{limit}-token text prefix: image content does not key the cache"), ev
    summary = f"B cached {b.cached_tokens} ≤ {limit} text-prefix tokens"
    if false_hit:
        summary += (f"; content-blind false hit: the router predicted {predicted} blocks of "
                    f"overlap on {b.worker}, the engine found {b.cached_tokens // bs}")
    return "pass", summary, ev


def judge_straddle(ctx: Context, traces: Sequence[RequestTrace]) -> Outcome:
    seed, swapped = traces
    starts = image_starts(swapped)
    bs = ctx.block_size
    if len(starts) < 2:
        return "inconclusive", "no expected layout for the two images", {}
    keep = (starts[1] // bs) * bs
    ev = {"second_image_start": starts[1], "full_blocks_before_second_image": keep // bs,
          "swapped_cached_tokens": swapped.cached_tokens, "seed_worker": seed.worker,
          "swapped_worker": swapped.worker,
          "first_image_straddles": starts[0] % bs != 0}
    if swapped.cached_tokens >= keep:
        return "pass", (f"swapping the second image kept {swapped.cached_tokens} cached tokens "
                        f"(≥ {keep}, the blocks before it)"), ev
    return "fail", (f"swapping the second image left {swapped.cached_tokens} cached tokens, "
                    f"fewer than the {keep} before it"), ev


def judge_staircase(ctx: Context, traces: Sequence[RequestTrace]) -> Outcome:
    cached = [t.cached_tokens for t in traces]
    bs = ctx.block_size
    incs = [cached[i + 1] - cached[i] for i in range(len(cached) - 1)]
    ev = {"cached_tokens": cached, "increments": incs, "workers": [t.worker for t in traces]}
    if not all(i > 0 for i in incs):
        return "fail", f"overlap did not strictly increase: {cached}", ev
    slack = ctx.thresholds.staircase_slack_blocks * bs
    if max(incs) - min(incs) > slack:
        return "fail", f"per-image increments {incs} differ by more than {slack} tokens", ev
    return "pass", f"overlap rose {cached} with per-image increments {incs}", ev


def judge_identity(ctx: Context, traces: Sequence[RequestTrace]) -> Outcome:
    seed, by_url, other_url = traces
    bs = ctx.block_size
    prefix = text_prefix_tokens(seed) or 0
    warm_limit = (prefix // bs) * bs

    def reused(t: RequestTrace) -> bool | None:
        if t.error or t.status is None or t.status >= 400:
            return None
        return t.cached_tokens > warm_limit

    ev = {"data_uri_cached": seed.cached_tokens, "url_cached": by_url.cached_tokens,
          "other_url_cached": other_url.cached_tokens, "text_prefix_limit": warm_limit,
          "workers": [seed.worker, by_url.worker, other_url.worker],
          "errors": failed_requests(traces)}
    url_reuse, other_reuse = reused(by_url), reused(other_url)
    if url_reuse is None or other_reuse is None:
        return "inconclusive", ("the router refused URL images: "
                                + "; ".join(ev["errors"])), ev
    if url_reuse and other_reuse:
        keyed = "image content (bytes or pixels): data URI and both URLs share cache"
    elif not url_reuse and not other_reuse:
        keyed = "the URL string: the same bytes by another URL or as a data URI miss"
    else:
        keyed = (f"mixed: URL after data URI reused={url_reuse}, second URL with the same "
                 f"bytes reused={other_reuse}")
    ev["keyed_by"] = keyed
    return "pass", f"the target keys image identity by {keyed}", ev


def judge_parity(ctx: Context, traces: Sequence[RequestTrace]) -> Outcome:
    rows = []
    verdict: Verdict = "pass"
    reasons = []
    for t in traces:
        lay = layout_of(t)
        expected = lay.engine_prompt_tokens if lay else None
        n_images = len(lay.images) if lay else 0
        row = {"request_id": t.request_id, "expected_prompt_tokens": expected,
               "engine_prompt_tokens": t.prompt_tokens, "processing_mode": t.processing_mode,
               "router_expanded_tokens": next(
                   (p.expanded_tokens for p in t.predictions if p.expanded_tokens), None)}
        rows.append(row)
        if expected is None or t.prompt_tokens is None:
            verdict = "inconclusive" if verdict == "pass" else verdict
            reasons.append(f"{t.request_id}: no expected layout or no prompt_tokens")
            continue
        diff = t.prompt_tokens - expected
        row["difference"] = diff
        if diff:
            verdict = "fail"
            per = diff / n_images if n_images else diff
            starts = image_starts(t)
            # The shorter of the two image runs ends first; ids differ from there on.
            n_expected = lay.images[0].tokens if lay and lay.images else 0
            block = ((starts[0] + min(n_expected, n_expected + int(per))) // ctx.block_size
                     if starts else None)
            row["first_divergent_block"] = block
            reasons.append(
                f"engine prompt_tokens {t.prompt_tokens} vs mmlens' expected {expected}: "
                f"{diff:+d} tokens ({per:+g} per image) — count drift between the router's "
                f"estimator and the engine's processor; blocks from {block} on shift and "
                "stop matching")
    if len(traces) == 2:
        a, b = traces
        if a.prompt_tokens is not None and b.prompt_tokens is not None:
            rows.append({"router_mode_vs_worker_mode": b.prompt_tokens - a.prompt_tokens})
            if a.prompt_tokens != b.prompt_tokens:
                verdict = "fail"
                reasons.append(f"router mode gave {a.prompt_tokens} prompt tokens, worker mode "
                               f"{b.prompt_tokens}")
    summary = "; ".join(reasons) or "expected, router and engine token counts agree"
    if not any(t.processing_mode == "worker" for t in traces):
        # Only router mode ran: say so, so a pass is not read as covering worker mode.
        summary += ("; worker mode not exercised (no worker-mode router: pass "
                    "--worker-mode-router, or a second router in worker mode to the Lab)")
    return verdict, summary, {"rows": rows}
