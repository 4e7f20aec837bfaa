"""Decision and trace bodies written without the fields at their defaults
(``mmlens.store.compact_bodies``): they read back as the records they were written from, for
random decisions and for the real captures' requests; they hold no ``null`` or ``[]`` of a
field whose default that is; a body written in full, as earlier versions wrote it, reads the
same."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from mmlens.collectors.observed_sink import ObservedSink

from mmlens.ingest.observed_logs import read_lines
from mmlens.records import RequestTrace, RoutingDecision
from mmlens.store import codec, compact_bodies, typed_check
from mmlens.store.compact_bodies import KEEP, OMIT_EMPTY_LIST, OMIT_NONE
from mmlens.store.readback import ENCODE_ERRORS
from mmlens.store.sqlite import Store
from tests.core.test_typed_check import decisions
from tests.fixtures_path import CAPTURES

needs_walk = pytest.mark.skipif(not compact_bodies.READY, reason="the compiled walk is not built")
_full = msgspec.json.Encoder(enc_hook=str)


def _omitted(body: object, cls: type) -> set[str]:
    omits = dict(compact_bodies.omits_of(cls))
    assert isinstance(body, dict)
    return {name for name in omits if name not in body}


def test_what_may_be_left_out_is_what_the_decoder_makes_again() -> None:
    omits = dict(compact_bodies.omits_of(RoutingDecision))
    assert omits["request_id"] == omits["router"] == omits["source"] == KEEP
    assert omits["worker"] == OMIT_NONE and omits["candidates"] == OMIT_EMPTY_LIST
    trace = dict(compact_bodies.omits_of(RequestTrace))
    for f in dataclasses.fields(RequestTrace):  # a default other than None or [] is written
        if f.default is not dataclasses.MISSING and f.default is not None:
            assert trace[f.name] == KEEP, f.name


@needs_walk
@settings(max_examples=300, deadline=None)
@given(ds=decisions())
def test_a_compact_body_reads_back_as_the_full_one(ds: list[RoutingDecision]) -> None:
    if not typed_check.all_typed(ds):
        return  # such a batch is checked by its read-back, whichever form it has
    try:
        compact = codec.decisions_body(ds)
        full = _full.encode(ds).decode()
    except ENCODE_ERRORS:
        return
    assert len(compact) <= len(full)
    got, want = codec.decisions([compact]), codec.decisions([full])
    assert _full.encode(got) == _full.encode(want)
    omits = dict(compact_bodies.omits_of(RoutingDecision))
    for d, body in zip(ds, json.loads(compact), strict=True):
        for name in omits:  # left out exactly when at its default
            at_default = getattr(d, name) in (None, []) and omits[name] != KEEP
            assert (name not in body) == at_default, name


@needs_walk
def test_the_captures_requests_read_back_from_compact_bodies(tmp_path: Path) -> None:
    lines = (CAPTURES / "smg_1.13_observed_log.jsonl").read_text().splitlines()
    ds, frags = read_lines(lines)
    store = Store(tmp_path / "x.db")
    sink = ObservedSink(store.add_traces, store.add_decisions, hold_s=0.0)
    assert store.add_decisions(ds) == len(ds)
    sink.add(frags)
    sink.flush(force=True)
    bodies = [b for (b,) in store.db.execute("SELECT body FROM decisions")]
    assert sum(len(json.loads(b)) for b in bodies) == len(ds)
    by_key = {(d.request_id, d.source, d.ts): d for d in ds}
    for got in codec.decisions(bodies):
        assert _full.encode(got) == _full.encode(by_key[(got.request_id, got.source, got.ts)])
    traces = [codec.trace(b) for (b,) in store.db.execute("SELECT body FROM traces")]
    assert traces and all(t is not None for t in traces)
    for (body,), t in zip(store.db.execute("SELECT body FROM traces"), traces, strict=True):
        assert json.loads(body) == {k: v for k, v in json.loads(_full.encode(t)).items()
                                    if k not in _omitted(json.loads(body), RequestTrace)}
        assert _omitted(json.loads(body), RequestTrace), "nothing left out of a log request"
    store.close()


def test_a_body_written_in_full_reads_as_before(tmp_path: Path) -> None:
    d = RoutingDecision("r1", "smg", "log:x", worker="w1", ts=1.0, image_tokens=[4])
    store = Store(tmp_path / "x.db")
    store.db.execute("INSERT INTO decisions VALUES (1.0, 'r1', 'smg', 'log:x', ?)",
                     (_full.encode([d]).decode(),))
    store.db.commit()
    assert store.add_decisions([dataclasses.replace(d, request_id="r2")]) == 1
    got = codec.decisions([b for (b,) in store.db.execute(
        "SELECT body FROM decisions ORDER BY request_id")])
    assert [g.request_id for g in got] == ["r1", "r2"]
    assert got[0] == d and got[1] == dataclasses.replace(d, request_id="r2")
    store.close()
