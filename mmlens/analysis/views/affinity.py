"""The Affinity page's tables: per image identity, images resident on several workers, and
each worker's resident images."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import islice
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


# A cell lists this many names, then how many more: on a fleet an image resident everywhere
# would otherwise be a 30 kB cell, and the page's tables megabytes the browser must parse.
LISTED = 8


def listed(items: Sequence[str], total: int | None = None) -> str:
    """The first ``LISTED`` items, then "+N more" (``total``: how many there are, when
    ``items`` holds only the first ones)."""
    n = len(items) if total is None else total
    head = ", ".join(items[:LISTED])
    return head if n <= LISTED else f"{head} +{n - LISTED} more"


def multi_resident_rows(several: Mapping[str, Sequence[str]],
                        names: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Most widely resident first; only the workers a cell lists are labelled (on a fleet an
    image resident everywhere has 1,000: labelling them all was most of the page's run)."""
    return [{"image": k[:16], "copies": len(v),
             "workers": listed([worker_label(w, names) for w in v[:LISTED]], len(v))}
            for k, v in sorted(several.items(), key=lambda kv: (-len(kv[1]), kv[0]))]


def worker_rows(sets: Mapping[str, Mapping[str, int]], names: Mapping[str, str] | None = None,
                ) -> list[dict[str, Any]]:
    return [{"worker": worker_label(w, names), "images": len(imgs),
             "image blocks": sum(imgs.values()),
             "identifiers": listed([k[:8] for k in islice(imgs, LISTED)], len(imgs))}
            for w, imgs in sets.items()]
