"""The read side returns typed records, and rows written before it decode unchanged: each old
body read back and printed again is the same JSON, field for field."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from mmlens.records import CollectorHealth, ExpectedLayout, RequestTrace, RoutingDecision
from mmlens.store import codec
from mmlens.store.reader import StoreReader
from mmlens.store.snapshot import build_snapshot
from mmlens.store.sqlite import Store

# What a trace prints for fields it was never given.
DEFAULTS = RequestTrace("r", "u", "smg", "m", 0.0, False).to_json()
OLD = json.loads((Path(__file__).parents[1] / "fixtures" / "store_rows_v1.json").read_text())


def _as_old(new: Any, old: Any) -> Any:
    """``new`` without the keys ``old`` lacks (fields added since), at every depth."""
    if isinstance(new, dict) and isinstance(old, dict):
        return {k: _as_old(new[k], old[k]) for k in old if k in new}
    if isinstance(new, list) and isinstance(old, list) and len(new) == len(old):
        return [_as_old(a, b) for a, b in zip(new, old, strict=True)]
    return new


def test_old_trace_bodies_decode_and_print_the_same_json() -> None:
    for body in OLD["traces"]:
        trace = codec.trace(json.dumps(body))
        assert isinstance(trace, RequestTrace)
        assert isinstance(trace.expected_layout, ExpectedLayout)
        assert all(isinstance(p, RoutingDecision) for p in trace.predictions)
        doc = trace.to_json()
        assert _as_old(doc, body) == body
        added = set(doc) - set(body)  # fields RequestTrace gained since: at their defaults
        assert added and added <= DEFAULTS.keys()
        assert {k: doc[k] for k in added} == {k: DEFAULTS[k] for k in added}
        # The stored order of fields is kept too (`mmlens snapshot --json` prints them).
        assert list(doc)[:len(body)] == list(body)
        assert list(doc["expected_layout"]) == list(body["expected_layout"])


def test_old_decision_bodies_decode_with_candidates_scores_and_gates() -> None:
    # As schema 4 holds them: each old row a one-decision array (``schema.migrate_v3``).
    (d,) = codec.decisions(json.dumps([b]) for b in OLD["decisions"])
    assert d.candidates[0].worker.startswith("grpc://") and d.gates[0].spill is False
    assert {s.source for s in d.scores} == {"policy_affinity", "expected_wait"}


def test_rows_from_older_versions_and_failed_layouts_decode() -> None:
    body = dict(OLD["traces"][0])
    for newer in ("response_id", "error_code", "dp_rank", "processing_mode"):
        del body[newer]  # fields added over time: absent in older rows
    body["predictions"] = [{"request_id": "r", "router": "smg", "source": "header"}]
    body["expected_layout"] = {"error": "UnknownFamilyError: no family"}
    body["cached_tokens"] = 80.0  # Python's json once wrote a float here
    trace = codec.trace(json.dumps(body))
    assert trace is not None and trace.response_id is None and trace.cached_tokens == 80
    assert trace.expected_layout is not None and not trace.expected_layout.ok
    assert trace.to_json()["expected_layout"] == {"error": "UnknownFamilyError: no family"}
    assert trace.predictions[0].candidates == []


def test_an_undecodable_row_is_skipped_not_fatal(tmp_path: Path, caplog) -> None:
    db = tmp_path / "s.db"
    store = Store(db)
    store.add_traces([RequestTrace("good", "http://r", "smg", "m", 1.0, False)])
    raw = sqlite3.connect(db)
    raw.execute("INSERT INTO traces VALUES (2.0, 'bad', 'http://r', '{\"request_id\": 3}')")
    raw.execute("INSERT INTO traces VALUES (3.0, 'junk', 'http://r', 'not json')")
    raw.commit()
    raw.close()
    assert [t.request_id for t in store.traces(10)] == ["good"]
    assert "skipping an undecodable stored RequestTrace" in caplog.text
    store.close()


def test_snapshot_of_an_old_store_prints_its_rows_unchanged(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    Store(db).close()
    raw = sqlite3.connect(db)
    for body in OLD["traces"]:
        raw.execute("INSERT INTO traces VALUES (?, ?, ?, ?)",
                    (body["ts"], body["request_id"], body["router"], json.dumps(body)))
    for h in OLD["health"]:
        raw.execute(f"INSERT INTO health ({', '.join(h)}) VALUES (?,?,?,?,?,?,?,?)",
                    tuple(h.values()))
    raw.commit()
    raw.close()
    reader = StoreReader(db)
    try:
        snap = build_snapshot(reader, n_traces=10, now=5.0)
    finally:
        reader.close()
    assert all(isinstance(h, CollectorHealth) for h in snap.health)
    doc = snap.to_json()
    old = sorted(OLD["traces"], key=lambda b: -b["ts"])
    assert _as_old(doc["traces"], old) == old
    assert [h["updated"] for h in doc["health"]] == [h["updated"] for h in OLD["health"]]
    assert list(doc["health"][0]) == [*OLD["health"][0], "instance"]


def test_a_part_layout_without_tokens_round_trips() -> None:
    body = {"parts": [{"kind": "image", "index": 0}, {"kind": "text", "chars": 37}]}
    lay = ExpectedLayout.from_summary(body)
    assert lay.ok and lay.block_keys is None and lay.to_json() == body
    assert ExpectedLayout.from_summary({**body, "text": "t"}).to_json() == {**body, "text": "t"}


@pytest.mark.parametrize("family", ["qwen3-vl", "kimi-k3", "llava-1.5"])
def test_the_layout_summary_round_trips_through_the_record(family: str) -> None:
    """Every key ``layout_summary`` writes has a field: a key added there without one would be
    dropped from stored traces."""
    from mmlens.layout.composition import ImageInput
    from mmlens.layout.modeldir import resolve_model
    from mmlens.layout.report import layout_summary
    from mmlens.layout.synthetic_images import synthetic_png

    model = resolve_model(family)
    red = ImageInput(64, 64, data=synthetic_png("solid", 64, 64), url="http://media/red.png")
    summary = layout_summary(model.layout([red, "Describe this."], block_size=16),
                             model.family, [red])
    assert ExpectedLayout.from_summary(summary).to_json() == summary
