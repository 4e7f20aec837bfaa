"""What the store keeps of each scrape, so an idle cluster does not fill it.

A scrape of an SMG router and two workers is ~800 series every interval, most of them
histogram buckets nothing reads and counters that did not move. Kept: every series of a
metric whose value changed since the last scrape (with the last unchanged sample before the
change, so a counter's step stays exactly where it was), one full scrape of each metric per
``keyframe_s`` (what reads the latest value or a window's first point finds one), and every
sample of the ``always`` metrics (liveness reads which scrapes listed a worker). Dropped:
histogram buckets other than ``READ_BUCKETS``, and the families of ``DROPPED_PREFIXES``.

Counter increases over any window come out as from every sample: a run of equal values
contributes nothing, and its last sample before a change is kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mmlens.records import MetricSample

# Histogram buckets an analysis reads (mmlens.ingest.metrics_smg, metrics_dynamo); every
# other ``*_bucket`` series is dropped before it is stored.
READ_BUCKETS = frozenset({"smg_cache_aware_match_ratio_bucket",
                          "dynamo_frontend_images_per_request_bucket"})
# SMG's own HTTP serving (which mmlens' polls of /workers and /v1/models move every scrape)
# and its async runtime's internals: nothing reads them, and they never stand still.
DROPPED_PREFIXES = ("smg_http_", "smg_tokio_")
KEYFRAME_S = 60.0

Group = tuple[str, str]  # (target, metric name)


class SampleThinner:
    def __init__(self, keyframe_s: float = KEYFRAME_S, always: Iterable[str] = ()) -> None:
        self.keyframe_s = keyframe_s
        self.always = frozenset(always)
        self._stored: dict[Group, tuple[float, frozenset[tuple[object, float]]]] = {}
        self._pending: dict[Group, list[MetricSample]] = {}  # the last unchanged scrape
        self.seen = 0
        self.kept = 0

    def keep(self, samples: Sequence[MetricSample]) -> list[MetricSample]:
        """The samples of one round of scrapes worth storing."""
        groups: dict[Group, list[MetricSample]] = {}
        for s in samples:
            if (s.name.endswith("_bucket") and s.name not in READ_BUCKETS) or \
                    s.name.startswith(DROPPED_PREFIXES):
                continue
            groups.setdefault((s.target, s.name), []).append(s)
        out: list[MetricSample] = []
        for key, group in groups.items():
            out += self._group(key, group)
        self.seen += len(samples)
        self.kept += len(out)
        return out

    def _group(self, key: Group, group: list[MetricSample]) -> list[MetricSample]:
        ts = max(s.ts for s in group)
        values = frozenset((s.labels, s.value) for s in group)
        last = self._stored.get(key)
        same = last is not None and last[1] == values
        if key[1] not in self.always and same and ts - (last[0] if last else ts) < \
                self.keyframe_s:
            self._pending[key] = group
            return []
        self._stored[key] = (ts, values)
        run_end = self._pending.pop(key, [])
        # A change after a run of equal scrapes: the run's last scrape first.
        return group if same else [*run_end, *group]
