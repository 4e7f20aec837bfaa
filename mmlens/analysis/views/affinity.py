"""The Affinity page's tables: per image identity, images resident on several workers, and
each worker's resident images."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mmlens.analysis.affinity import ImageAffinity
from mmlens.analysis.views.common import clock, worker_label


def image_rows(affinities: Sequence[ImageAffinity], names: Mapping[str, str] | None = None,
               ) -> list[dict[str, Any]]:
    return [{"image": a.identity[:16], "size": a.size, "requests": a.requests,
             "workers seen": len(a.workers), "stuck ratio": round(a.stuck_ratio, 2),
             "main worker": worker_label(a.workers.most_common(1)[0][0], names),
             "first seen": clock(a.first_seen), "last seen": clock(a.last_seen)}
            for a in affinities]


def multi_resident_rows(several: Mapping[str, Sequence[str]]) -> list[dict[str, Any]]:
    return [{"image": k[:16], "workers": ", ".join(v)} for k, v in several.items()]


def worker_rows(sets: Mapping[str, Mapping[str, int]], names: Mapping[str, str] | None = None,
                ) -> list[dict[str, Any]]:
    return [{"worker": worker_label(w, names), "images": len(imgs),
             "image blocks": sum(imgs.values()),
             "identifiers": ", ".join(k[:8] for k in imgs)} for w, imgs in sets.items()]
