"""The compiled type check the decision and trace writes take instead of their read-back
decode (``mmlens.store.typed_check``): a batch it passes reads back under the readers' strict
decode, for random decisions and traces holding values of every type; the real captures'
decisions and traces pass it; a decision it fails is still checked (and set aside) by the
read-back."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmlens.ingest.observed_logs import read_lines
from mmlens.records import RequestTrace, RoutingDecision, SpillGate
from mmlens.store import codec, typed_check, writes
from mmlens.store.readback import ENCODE_ERRORS
from mmlens.store.sqlite import Store
from tests.fixtures_path import CAPTURES

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 65), 1 << 65), st.floats(),
    st.text(max_size=4), st.sampled_from(["smg", "dynamo", "\ud800", "a\x00"]),
    st.lists(st.one_of(st.integers(-3, 3), st.text(max_size=2), st.none()), max_size=3),
    st.dictionaries(st.one_of(st.text(max_size=2), st.integers(0, 3)),
                    st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=2)),
                    max_size=2),
    st.tuples(st.integers()), st.frozensets(st.integers(0, 3), max_size=2))


def _typed_value(code: int, arg: Any, draw: Any, depth: int) -> Any:
    """A value of the kind, at the edges of its type (big ints, NaN, empty text)."""
    if code & typed_check.OPTIONAL and draw(st.booleans()):
        return None
    code &= ~typed_check.OPTIONAL
    if code == typed_check.STR:
        return draw(st.text(max_size=3))
    if code == typed_check.INT:
        return draw(st.integers(-(1 << 63), (1 << 64) - 1))
    if code == typed_check.FLOAT:
        return draw(st.floats() | st.integers(-(1 << 63), (1 << 64) - 1))
    if code == typed_check.BOOL:
        return draw(st.booleans())
    if code == typed_check.LITERAL:
        return draw(st.sampled_from(sorted(arg)))
    if code == typed_check.LIST:
        return [_value(*arg, draw, depth + 1) for _ in range(draw(st.integers(0, 2)))]
    if code == typed_check.DICT_STR:
        return {draw(st.text(max_size=2)): _value(*arg, draw, depth + 1)
                for _ in range(draw(st.integers(0, 2)))}
    if code == typed_check.RECORD:
        return _record(arg, draw, depth + 1)
    if code == typed_check.UNION:
        return _typed_value(*draw(st.sampled_from(arg)), draw, depth)
    return draw(VALUES)  # Any


def _value(code: int, arg: Any, draw: Any, depth: int) -> Any:
    """Mostly a value of the declared kind, sometimes any value at all."""
    if depth > 2 or draw(st.integers(0, 59)) == 0:
        return draw(VALUES)
    return _typed_value(code, arg, draw, depth)


def _record(cls: type, draw: Any, depth: int = 0) -> Any:
    spec = typed_check.specs_of(cls)[cls]
    return cls(**{name: _value(code, arg, draw, depth) for name, code, arg in spec})


@st.composite
def decisions(draw: Any) -> list[RoutingDecision]:
    return [_record(RoutingDecision, draw) for _ in range(draw(st.integers(1, 3)))]


@pytest.mark.skipif(not typed_check.READY, reason="the compiled check is not built")
@settings(max_examples=400, deadline=None)
@given(ds=decisions())
def test_a_batch_the_check_passes_reads_back(ds: list[RoutingDecision]) -> None:
    if not typed_check.all_typed(ds):
        return
    try:
        body = codec.decisions_body(ds)
    except ENCODE_ERRORS:
        return  # refused at its encode, which comes first on the write path
    assert codec.all_read_back([body], codec.folded_dec)


@st.composite
def traces(draw: Any) -> list[RequestTrace]:
    """Traces as the write path's shortcut takes them: no expected layout (one is written as
    its own JSON and always read back)."""
    return [dataclasses.replace(_record(RequestTrace, draw), expected_layout=None)
            for _ in range(draw(st.integers(1, 2)))]


@pytest.mark.skipif(not typed_check.READY, reason="the compiled check is not built")
@settings(max_examples=300, deadline=None)
@given(ts=traces())
def test_a_trace_batch_the_check_passes_reads_back(ts: list[RequestTrace]) -> None:
    """What the trace writes take without a decode (``_trace_bodies``) reads back; a batch
    it refuses (no exception) is checked trace by trace."""
    bodies = writes._trace_bodies(ts)
    if bodies is not None:
        assert codec.all_read_back(bodies, codec.traces_dec)


@pytest.mark.skipif(not typed_check.READY, reason="the compiled check is not built")
def test_the_captures_traces_pass_and_a_mistyped_one_fails() -> None:
    lines = (CAPTURES / "smg_1.13_observed_log.jsonl").read_text().splitlines()
    _, frags = read_lines(lines)
    assert frags and typed_check.all_typed(frags)
    for name, value in (("status", "200"), ("stream", 1), ("images", [{"width": 3}]),
                        ("provenance", {"model": 5})):
        bad = dataclasses.replace(frags[0], **{name: value})
        assert not typed_check.all_typed([*frags, bad]), name


def test_the_check_is_built_where_expected() -> None:
    if os.environ.get("MMLENS_EXPECT_NATIVE"):
        assert typed_check.READY


@pytest.mark.skipif(not typed_check.READY, reason="the compiled check is not built")
def test_the_captures_decisions_pass_and_a_mistyped_one_fails() -> None:
    lines = (CAPTURES / "smg_1.13_observed_log.jsonl").read_text().splitlines()
    ds, _ = read_lines(lines)
    assert ds and typed_check.all_typed(ds)
    for name, value in (("worker", 5), ("overlap_blocks", 1.5), ("router", "other"),
                        ("image_tokens", [True]), ("attempt", -(1 << 64) + 1)):
        bad = dataclasses.replace(ds[0], **{name: value})
        assert not typed_check.all_typed([*ds, bad]), name
    gate = SpillGate(worker=3)
    assert not typed_check.all_typed([dataclasses.replace(ds[0], gates=[gate])])


def test_a_mistyped_decision_is_set_aside_alone(tmp_path: Path) -> None:
    store = Store(tmp_path / "x.db")
    good = RoutingDecision("r1", "smg", "log:x", worker="w1", ts=1.0)
    bad = RoutingDecision("r2", "smg", "log:x", worker=["w"], ts=1.0)  # type: ignore[arg-type]
    assert store.add_decisions([good, bad]) == 1
    assert [r[0] for r in store.db.execute("SELECT request_id FROM decisions")] == ["r1"]
    assert store.rejected
    store.close()
