"""Write only what reads back: for every record type the store writes (traces, decisions,
samples, KV events, router-vs-engine views), any record, however odd its fields (lone
surrogates, NUL, non-finite or huge times, a list where text is due), is either stored so that
the readers decode it, or refused alone and counted in ``store.rejected`` — never stored to be
skipped by every reader later, never taking the records beside it along."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from mmlens.analysis.kv_divergence import ViewPoint
from mmlens.records import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    MetricSample,
    RequestTrace,
    RoutingDecision,
    RoutingScore,
)
from mmlens.store import codec
from mmlens.store.sqlite import Store
from tests.fuzz.strategies import QUARANTINED, SETTINGS

pytestmark = pytest.mark.fuzz

# Text with lone surrogates and NUL among the ordinary characters.
TEXT = st.one_of(st.text(st.characters(blacklist_categories=()), max_size=12),
                 st.sampled_from(["\udc80", "a\x00b", "é", "", "w1"]))
TIMES = st.one_of(st.floats(), st.sampled_from([float("inf"), 1e300, -1.0, 1.7e9, 0.0]))
# What a parser may have let through where text or a number is due (shallow: the cost of
# drawing deep values is all this test would measure).
ODDITIES = st.one_of(st.integers(-(1 << 70), 1 << 70), st.floats(), st.booleans(),
                     st.lists(st.integers(), max_size=2), st.dictionaries(TEXT, st.none(),
                                                                            max_size=1))
ODD = st.one_of(TEXT, ODDITIES, st.none())
INTS = st.one_of(st.none(), st.integers(-(1 << 70), 1 << 70), ODDITIES)


def decisions() -> st.SearchStrategy[RoutingDecision]:
    return st.builds(RoutingDecision, request_id=TEXT, router=st.sampled_from(["smg", "dynamo"]),
                     source=TEXT, worker=ODD, ts=st.one_of(st.none(), TIMES),
                     overlap_blocks=INTS,
                     scores=st.lists(st.builds(RoutingScore, source=TEXT, worker=ODD),
                                     max_size=2))


def traces() -> st.SearchStrategy[RequestTrace]:
    return st.builds(RequestTrace, request_id=TEXT, router=TEXT, router_kind=TEXT, model=ODD,
                     ts=TIMES, stream=st.one_of(st.none(), st.booleans(), ODDITIES),
                     status=INTS, worker=ODD, prompt_tokens=INTS,
                     predictions=st.lists(decisions(), max_size=1))


_ids = itertools.count()


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    s = Store(":memory:")
    yield s
    s.close()


def rows(store: Store, table: str, column: str, after: int) -> list[Any]:
    """``column`` of the rows added after row id ``after``."""
    return [v for (v,) in store._rows(f"SELECT {column} FROM {table} WHERE rowid > ?",
                                      (after,))]


def last_row(store: Store, table: str) -> int:
    return int(store._one(f"SELECT coalesce(max(rowid), 0) FROM {table}"))


@contextlib.contextmanager
def written(store: Store, table: str, given_n: int,
            size: Callable[[Any], int] | None = None) -> Iterator[list[int]]:
    """Around one write of ``given_n`` records: yields [row id before]; checks afterwards that
    each record was either stored or refused alone (``size``: the records a row's body
    holds, where a row holds several)."""
    before, refused = last_row(store, table), sum(store.rejected.values())
    yield [before]
    stored = len(rows(store, table, "rowid", before)) if size is None else sum(
        map(size, rows(store, table, "body", before)))
    assert stored + sum(store.rejected.values()) - refused == given_n, dict(store.rejected)
    if sum(store.rejected.values()) > refused:
        event(QUARANTINED)


@SETTINGS
@given(items=st.lists(traces(), min_size=1, max_size=3))
@example(items=[RequestTrace("r", "smg", "smg", ["m"], 1.0, False)])  # type: ignore[arg-type]
@example(items=[RequestTrace("r\udc80", "smg", "smg", "m", float("inf"), None)])
def test_traces_read_back(store: Store, items: list[RequestTrace]) -> None:
    for t in items:  # one request each: merging is another test's
        t.request_id = f"{t.request_id}#{next(_ids)}"
        t.response_id, t.trace_id, t.aliases = None, None, []
    with written(store, "traces", len(items)) as before:
        store.add_traces(items)
    bodies = rows(store, "traces", "body", before[0])
    assert len(codec.traces(bodies)) == len(bodies)  # every stored row decodes


@SETTINGS
@given(items=st.lists(decisions(), min_size=1, max_size=4))
@example(items=[RoutingDecision("r", "smg", "log:cache_trace", worker=5)])  # type: ignore
@example(items=[RoutingDecision("r", "smg", "log", policy="cache\udc80")])
def test_decisions_read_back(store: Store, items: list[RoutingDecision]) -> None:
    with written(store, "decisions", len(items), lambda body: len(json.loads(body))) as before:
        stored = store.add_decisions(items, ts=1.0)
    bodies = rows(store, "decisions", "body", before[0])
    assert len(codec.decisions(bodies)) == stored == sum(len(json.loads(b)) for b in bodies)


@SETTINGS
@given(items=st.lists(st.builds(MetricSample, target=TEXT, name=TEXT,
                                labels=st.lists(st.tuples(TEXT, TEXT), max_size=2).map(tuple),
                                value=st.floats(), ts=TIMES), min_size=1, max_size=4))
def test_samples_read_back(store: Store, items: list[MetricSample]) -> None:
    with written(store, "samples", len(items)) as before:
        n = store.add_samples(items)
    got = rows(store, "samples", "labels", before[0])
    assert len(got) == n and all(isinstance(codec.json_dict(lb), dict) for lb in got)


KV_EVENTS = st.one_of(
    st.builds(BlockStored, worker=TEXT, rank=st.integers(0, 7), seq=st.integers(0, 1 << 40),
              ts=TIMES, block_hashes=st.lists(st.integers(0, (1 << 64) - 1), min_size=1,
                                              max_size=3),
              parent=st.none(), token_ids=st.just([]), block_size=st.just(16)),
    st.builds(BlockRemoved, worker=TEXT, rank=st.integers(0, 7), seq=st.integers(0, 1 << 40),
              ts=TIMES, block_hashes=st.lists(st.integers(0, (1 << 64) - 1), max_size=3)),
    st.builds(AllBlocksCleared, worker=TEXT, rank=st.integers(0, 7),
              seq=st.integers(0, 1 << 40), ts=TIMES))


@SETTINGS
@given(items=st.lists(KV_EVENTS, min_size=1, max_size=4))
@example(items=[BlockStored("w", 0, 1, float("inf"), [1], None, [], 16)])
def test_kv_events_read_back(store: Store, items: list[Any]) -> None:
    for ev in items:
        ev.idx = next(_ids)  # distinct events
    with written(store, "kv_events", len(items)) as before:
        n = store.add_kv_events(items)
    got = store._rows("SELECT ts, worker, rank, seq, kind, n_blocks, parent, hashes, images "
                      "FROM kv_events WHERE rowid > ?", (before[0],))
    assert len([codec.kv_row(r) for r in got]) == n == len(got)


@SETTINGS
@given(items=st.lists(st.builds(ViewPoint, ts=TIMES, worker=TEXT, source=TEXT,
                                router_blocks=st.none(), engine_blocks=st.none(),
                                router_only=st.integers(0, 9), engine_only=st.integers(0, 9)),
                      min_size=1, max_size=3))
def test_kv_views_read_back(store: Store, items: list[ViewPoint]) -> None:
    with written(store, "kv_views", len(items)) as before:
        n = store.add_kv_views(items)
    assert n == len(rows(store, "kv_views", "worker", before[0]))


def _strict(body: str, kind: type) -> bool:
    try:
        msgspec.json.decode(body, type=kind)
    except msgspec.DecodeError:
        return False
    return True


@SETTINGS
@given(d=decisions(), t=traces())
@example(d=RoutingDecision("r", "smg", "log", worker=5), t=RequestTrace(  # type: ignore
    "r", "smg", "smg", "m", 1.0, None, status="200"))  # type: ignore[arg-type]
def test_mirrors_accept_what_the_records_accept(d: RoutingDecision, t: RequestTrace) -> None:
    """The write path checks bodies against the records' Struct mirrors: a body one accepts
    and the other refuses would store what readers skip, or refuse what they read."""
    for record, kind, decoder in ((d, RoutingDecision, codec.folded_dec),
                                  (t, RequestTrace, codec.traces_dec)):
        try:
            body = (codec.decisions_body([record]) if kind is RoutingDecision  # type: ignore
                    else codec.trace_body(record))  # type: ignore[arg-type]
        except (ValueError, TypeError, OverflowError, UnicodeError):
            continue  # not encodable: refused before any read-back
        accepted = _strict(body, list[kind] if kind is RoutingDecision else kind)
        event(f"{kind.__name__} accepted={accepted}")
        assert codec.all_read_back([body], decoder) is accepted, body
