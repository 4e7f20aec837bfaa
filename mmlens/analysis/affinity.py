"""Image identity → worker affinity from recorded traces, and residency from KV state."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from mmlens.analysis.fleet import KEEP, other_label
from mmlens.records import ImageInfo, RequestTrace, ResidentSummary


@dataclass(slots=True)
class ImageAffinity:
    identity: str
    requests: int = 0
    workers: Counter[str] = field(default_factory=Counter)
    first_seen: float | None = None
    last_seen: float | None = None
    size: str = ""

    @property
    def stuck_ratio(self) -> float:
        """Share of this image's requests that went to its most frequent worker."""
        return max(self.workers.values()) / self.requests if self.requests else 0.0


def image_key(image: ImageInfo, scheme: str = "smg_blake3") -> str | None:
    ids = image.identities
    return ids.get(scheme) or ids.get("smg_blake3") or ids.get("dynamo_mm_hash_url")


def image_affinity(traces: Iterable[RequestTrace]) -> list[ImageAffinity]:
    """Per image identity seen in successful traces: requests and where they landed."""
    by_id: dict[str, ImageAffinity] = {}
    for t in traces:
        worker = t.worker
        if not worker or t.error:
            continue
        for im in t.images:
            key = image_key(im)
            if key is None:
                continue
            a = by_id.setdefault(key, ImageAffinity(key))
            a.requests += 1
            a.workers[worker] += 1
            a.first_seen = t.ts if a.first_seen is None else min(a.first_seen, t.ts)
            a.last_seen = t.ts if a.last_seen is None else max(a.last_seen, t.ts)
            if im.width:
                a.size = f"{im.width}x{im.height}"
    return sorted(by_id.values(), key=lambda a: (-a.requests, a.identity))


def sankey_links(affinities: Sequence[ImageAffinity], max_images: int = 40,
                 keep_workers: int = KEEP) -> list[tuple[str, str, int]]:
    """``(image identity, worker, requests)`` for the busiest ``max_images`` images; on a
    fleet the ``keep_workers`` workers that served them most by name and the others as one
    node (a Sankey of hundreds of worker nodes takes the browser seconds and says nothing)."""
    shown = affinities[:max_images]
    served: Counter[str] = Counter()
    for a in shown:
        served.update(a.workers)
    if len(served) <= keep_workers:
        return [(a.identity, w, n) for a in shown for w, n in sorted(a.workers.items())]
    top = {w for w, _ in served.most_common(keep_workers)}
    other = other_label(len(served) - keep_workers)
    out = []
    for a in shown:
        out += [(a.identity, w, n) for w, n in sorted(a.workers.items()) if w in top]
        rest = sum(n for w, n in a.workers.items() if w not in top)
        if rest:
            out.append((a.identity, other, rest))
    return out


def multi_resident(kv_state: Sequence[ResidentSummary]) -> dict[str, list[str]]:
    """Image identifiers (as the engines key them) resident on more than one worker."""
    where: dict[str, set[str]] = {}
    for row in kv_state:
        for ident, blocks in row.images.items():
            if blocks:
                where.setdefault(ident, set()).add(row.label)
    return {k: sorted(v) for k, v in sorted(where.items()) if len(v) > 1}


def worker_image_sets(kv_state: Sequence[ResidentSummary]) -> dict[str, dict[str, int]]:
    return {row.label: {k: v for k, v in row.images.items() if v} for row in kv_state}
