"""What a replay sends: per recorded request, when (its arrival, scaled), the images (the
recorded sizes, bytes made from the recorded identities) and the text (the stored text, or
synthetic words of the recorded length), and how many output tokens to ask for.

The input is the recorded workload (``mmlens.whatif.workload.RecordedRequest``). A request
the replay cannot rebuild is skipped and counted under its reason; one it rebuilds only
approximately is counted too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from mmlens.errors import LayoutError
from mmlens.replay.text import TextFitter
from mmlens.whatif.workload import RecordedRequest

DEFAULT_MAX_TOKENS = 8


@dataclass(frozen=True, slots=True)
class PlannedImage:
    identity: str
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    source_id: str  # the recorded request's id
    offset_s: float  # when to send it, from the replay's start (already scaled by the speed)
    model: str
    images: tuple[PlannedImage, ...]
    text: str
    text_source: str  # stored | synthetic
    prompt_tokens: int  # the recorded prompt length (expanded, what the engine counted)
    fitted_tokens: int  # the replayed prompt's length as the layout model counts it
    max_tokens: int
    recorded_prompt: int | None  # the engine's prompt_tokens when recorded
    recorded_cached: int | None
    recorded_worker: str | None
    stream: bool = False  # as recorded (False when unknown)


@dataclass
class Plan:
    requests: list[PlannedRequest]
    speed: float
    recorded_span_s: float  # first to last recorded arrival, unscaled
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> requests
    approximations: dict[str, int] = field(default_factory=dict)  # what -> requests

    @property
    def asked_rate(self) -> float | None:
        """Requests per second the schedule asks for (None: under two, or all at once)."""
        span = self.recorded_span_s / self.speed
        return (len(self.requests) - 1) / span if len(self.requests) > 1 and span > 0 else None


def recorded_length(r: RecordedRequest) -> int | None:
    """The prompt's expanded length: the recorded layout's, else the engine's count."""
    if r.segments:
        return sum(s.length for s in r.segments)
    return r.prompt_tokens


def text_key(r: RecordedRequest, length: int) -> str | None:
    """What identifies the request's text without the text: the content-blind block chain
    (equal for two prompts with equal tokens in every full block, whatever the images'
    content) and the length; None when the store holds no block keys."""
    if r.keys is None:
        return None
    last = r.keys.shapes[-1] if r.keys.shapes else "none"
    return f"shapes:{last}:{length}:{len(r.images)}"


def _images(r: RecordedRequest) -> tuple[PlannedImage, ...] | None:
    out = []
    for i, im in enumerate(r.images):
        if im.width is None or im.height is None:
            return None
        # An image nobody identified is never taken for another one.
        out.append(PlannedImage(im.identity or f"unknown:{r.request_id}:{i}", im.width,
                                im.height))
    return tuple(out)


def plan(recorded: Sequence[RecordedRequest], fitter: TextFitter, *, speed: float = 1.0,
         texts: Mapping[str, str] | None = None, model: str | None = None,
         max_tokens: int | None = None) -> Plan:
    """The replay of ``recorded`` (by arrival) at ``speed`` x its timing. ``texts``: the
    stored prompt text per request id (only requests recorded with their text); ``model``
    overrides the recorded model name; ``max_tokens`` the recorded output lengths."""
    if speed <= 0:
        raise ValueError(f"speed must be positive, got {speed}")
    texts = texts or {}
    ordered = sorted(recorded, key=lambda r: r.ts)
    skipped: Counter[str] = Counter()
    approx: Counter[str] = Counter()
    out: list[PlannedRequest] = []
    kept: list[float] = []
    for r in ordered:
        if not r.ok:
            skipped["failed when recorded"] += 1
            continue
        length = recorded_length(r)
        if length is None:
            skipped["prompt length unknown"] += 1
            continue
        images = _images(r)
        if images is None:
            skipped["image size unknown"] += 1
            continue
        if any(im.identity.startswith("unknown:") for im in images):
            approx["image identity unknown (a new image each)"] += 1
        sizes = [(im.width, im.height) for im in images]
        try:
            if r.request_id in texts:
                text, source = texts[r.request_id], "stored"
                fitted = fitter.prompt_tokens(text, sizes)
            else:
                key = text_key(r, length)
                if key is None:
                    approx["text identity unknown (a new text each)"] += 1
                    key = f"request:{r.request_id}"
                fit = fitter.fit(key, length, sizes)
                text, source, fitted = fit.text, "synthetic", fit.tokens
        except LayoutError:
            skipped["layout model refused the images"] += 1
            continue
        if fitted != length:
            approx["prompt length not matched"] += 1
        out_tokens = max_tokens if max_tokens is not None else r.output_tokens
        if out_tokens is None:
            approx["output length unknown (default used)"] += 1
            out_tokens = DEFAULT_MAX_TOKENS
        kept.append(r.ts)
        out.append(PlannedRequest(
            source_id=r.request_id, offset_s=0.0, model=model or r.model, images=images,
            text=text, text_source=source, prompt_tokens=length, fitted_tokens=fitted,
            max_tokens=max(int(out_tokens), 1), recorded_prompt=r.prompt_tokens,
            recorded_cached=r.cached_tokens,
            recorded_worker=r.worker, stream=bool(r.stream)))
    t0 = kept[0] if kept else 0.0
    out = [replace(p, offset_s=(ts - t0) / speed) for p, ts in zip(out, kept, strict=True)]
    span = (kept[-1] - t0) if kept else 0.0
    return Plan(out, speed, span, dict(skipped), dict(approx))

