"""Router view vs engine holdings: per worker, blocks the router believes resident that the
engine no longer holds (``router_only``) and blocks the engine holds that the router does not
know (``engine_only``), over time.

Three sources, each as exact as the router lets it be:
- ``event_plane``: block sets. Dynamo's router indexes what its event plane delivers (NATS or
  the ZMQ broker); mmlens hears the same plane and the engines' own streams, keyed by the
  engine's block hash in both.
- ``index_gauge``: counts. SMG exports ``smg_kv_index_blocks{worker}`` (its positional index)
  and no block list; the difference of counts bounds the divergence from below.
- ``prediction``: per routed request, the overlap the router predicted against the tokens the
  engine found cached (approximate-mode routers have no other view).

Two views fed by different transports race by a few milliseconds, so a set difference counts
only once it has persisted for two consecutive comparisons (``previous``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mmlens.analysis.request_view import predicted_tokens
from mmlens.records import RequestTrace, Verdict

ALERT_SHARE = 0.2
ALERT_MIN_BLOCKS = 4
SOURCES = ("event_plane", "index_gauge", "prediction")


@dataclass(frozen=True, slots=True)
class ViewPoint:
    ts: float
    worker: str
    source: str
    router_blocks: int | None
    engine_blocks: int | None
    router_only: int
    engine_only: int
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class DivergenceAlert:
    worker: str
    source: str
    message: str
    since: float | None = None  # when the divergence began, as far as the points show


Diffs = dict[str, tuple[frozenset[Any], frozenset[Any]]]


def compare_sets(engine: Mapping[str, Collection[Any]], router: Mapping[str, Collection[Any]],
                 ts: float, previous: Diffs | None = None) -> tuple[list[ViewPoint], Diffs]:
    """Workers present in both views; returns the points and this round's raw differences
    (pass them as ``previous`` next time)."""
    points: list[ViewPoint] = []
    current: Diffs = {}
    for worker in sorted(set(engine) & set(router)):
        e, r = engine[worker], router[worker]
        e_set = e if isinstance(e, (set, frozenset)) else set(e)
        r_set = r if isinstance(r, (set, frozenset)) else set(r)
        r_only = frozenset(r_set - e_set)
        e_only = frozenset(e_set - r_set)
        current[worker] = (r_only, e_only)
        prev_r, prev_e = (previous or {}).get(worker, (frozenset(), frozenset()))
        points.append(ViewPoint(ts, worker, "event_plane", len(r_set), len(e_set),
                                len(r_only & prev_r), len(e_only & prev_e)))
    return points, current


def compare_counts(engine: Mapping[str, int], router: Mapping[str, int], ts: float,
                   ) -> list[ViewPoint]:
    """Count-only views (SMG): the router's block count against the engine's."""
    return [ViewPoint(ts, w, "index_gauge", router[w], engine[w], max(0, router[w] - engine[w]),
                      max(0, engine[w] - router[w]))
            for w in sorted(set(engine) & set(router))]


def prediction_points(traces: Iterable[RequestTrace], default_block_size: int = 16,
                      ) -> list[ViewPoint]:
    """One point per routed request whose router predicted an overlap: predicted blocks the
    engine did not find are router-only, found blocks beyond the prediction engine-only."""
    out = []
    for t in traces:
        predicted = predicted_tokens(t)
        if predicted is None or not t.worker or t.error or t.cached_tokens is None:
            continue  # an unknown realized hit is no evidence of a missing block
        sizes = [p.block_size for p in t.predictions if p.block_size]
        lay = t.expected_layout
        bs = sizes[0] if sizes else (lay.block_size if lay is not None else 0)
        bs = bs or default_block_size
        pred_blocks, cached_blocks = predicted // bs, t.cached_tokens // bs
        out.append(ViewPoint(t.ts or 0.0, t.worker, "prediction", pred_blocks,
                             cached_blocks, max(0, pred_blocks - cached_blocks),
                             max(0, cached_blocks - pred_blocks), t.request_id))
    return sorted(out, key=lambda p: p.ts)


# Verdicts that read a predicted-but-missing block as content-blind (alerted as ``false_hits``)
# or as possibly so, not as a router view gone stale.
CONTENT_BLIND = frozenset({"false_hit", "hit_or_false_hit"})


def counted_ids(verdicts: Mapping[str, Verdict]) -> frozenset[str]:
    """Requests whose prediction is evidence of a stale router view: judged (the verdict job
    stores it some seconds after the response; until then a content-blind false hit looks
    like one) and not judged content-blind."""
    return frozenset(rid for rid, v in verdicts.items() if v.category not in CONTENT_BLIND)


def latest(points: Iterable[ViewPoint]) -> dict[tuple[str, str], ViewPoint]:
    """The newest point per (worker, source)."""
    out: dict[tuple[str, str], ViewPoint] = {}
    for p in points:
        key = (p.worker, p.source)
        if key not in out or p.ts >= out[key].ts:
            out[key] = p
    return out


def _past(diff: int, base: int | None, share: float, min_blocks: int) -> bool:
    return diff >= min_blocks and diff > share * max(base or 0, 1)


def _streak_start(series: Sequence[ViewPoint], holds: Callable[[ViewPoint], bool]) -> float:
    """When the newest run of points for which ``holds`` is true began."""
    start = series[-1].ts
    for p in reversed(series):
        if not holds(p):
            break
        start = p.ts
    return start


def alerts(points: Sequence[ViewPoint], share: float = ALERT_SHARE,
           min_blocks: int = ALERT_MIN_BLOCKS, counted: Collection[str] | None = None,
           ) -> list[DivergenceAlert]:
    """Workers whose router view diverges from the engine's holdings past ``share`` of the
    router's blocks (at least ``min_blocks``), judged on each source's latest point (the sum
    of a prediction's recent points: one request is one sample); each says since when.

    Not alerted, since a healthy content-blind router shows them all the time: predictions of
    requests not in ``counted`` (when given: see ``counted_ids``), and a count-only index
    (SMG) holding fewer blocks than the engine: it keys blocks by token ids, so two images of
    one size share its entries while the engine stores both."""
    found: list[DivergenceAlert] = []
    series: dict[tuple[str, str], list[ViewPoint]] = {}
    for p in sorted(points, key=lambda q: q.ts):
        if p.source != "prediction" or counted is None or p.request_id in counted:
            series.setdefault((p.worker, p.source), []).append(p)
    for (worker, source), items in sorted(series.items()):
        p = items[-1]
        if source == "prediction":
            recent = items[-10:]
            r_only = sum(q.router_only for q in recent)
            base = sum(q.router_blocks or 0 for q in recent)
            what = f"{len(recent)} recent request(s) predicted {base} block(s)"
            since = next((q.ts for q in recent if q.router_only), p.ts)
        else:
            r_only, base = p.router_only, p.router_blocks or 0
            what = f"the router holds {base} block(s) for it"
            since = _streak_start(items, lambda q: _past(q.router_only, q.router_blocks,
                                                         share, min_blocks))
        if _past(r_only, base, share, min_blocks):
            found.append(DivergenceAlert(worker, source, (
                f"{worker}: {r_only} block(s) the router believes resident are not in the "
                f"engine ({source.replace('_', ' ')}; {what}) — routing there expects cache "
                "the engine evicted"), since))
        elif source == "event_plane" and _past(p.engine_only, p.engine_blocks, share,
                                               min_blocks):
            found.append(DivergenceAlert(worker, source, (
                f"{worker}: the engine holds {p.engine_only} block(s) the router does not know "
                "(event plane) — lost or unapplied KV events"), _streak_start(
                    items, lambda q: _past(q.engine_only, q.engine_blocks, share, min_blocks))))
    return found


def engine_block_sets(workers: Mapping[tuple[str, int], Any]) -> dict[str, set[Any]]:
    """Per worker (ranks merged): the block hashes of a resident index's ``workers`` map."""
    out: dict[str, set[Any]] = {}
    for (worker, _rank), res in workers.items():
        out.setdefault(worker, set()).update(res.blocks)
    return out


@dataclass(frozen=True, slots=True)
class ViewModel:
    points: list[ViewPoint]
    alerts: list[DivergenceAlert]
    rows: list[dict[str, Any]]


def view_model(stored: Sequence[Sequence[Any]], traces: Sequence[RequestTrace],
               verdicts: Mapping[str, Verdict]) -> ViewModel:
    """The Cache page's section: stored comparisons (``kv_views`` rows) and per-request
    predictions, the latest per worker and source as a table, and the alerts."""
    points = [ViewPoint(float(r[0]), str(r[1]), str(r[2]), r[3], r[4], int(r[5]), int(r[6]))
              for r in stored]
    points += prediction_points(traces)
    points.sort(key=lambda p: p.ts)
    rows = [{"worker": p.worker, "source": p.source, "router blocks": p.router_blocks,
             "engine blocks": p.engine_blocks, "router only": p.router_only,
             "engine only": p.engine_only} for (_, _), p in sorted(latest(points).items())]
    return ViewModel(points, alerts(points, counted=counted_ids(verdicts)), rows)
