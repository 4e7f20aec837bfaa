"""Fragments of one request from several sources become one record: keys, field precedence,
provenance, and what stays unknown."""

from __future__ import annotations

from mmlens.ingest.observed import (
    SOURCE_LOG,
    SOURCE_OTLP,
    SOURCE_TAP,
    fragment,
    keys_of,
    known,
    merge,
    merge_all,
    put,
)
from mmlens.ingest.router_logs import request_keys
from mmlens.records import RequestTrace
from mmlens.store.open import open_store


def frag(rid: str, source: str, **fields: object) -> RequestTrace:
    t = fragment(rid, source, 10.0)
    for k, v in fields.items():
        put(t, k, v, source)
    return t


def test_dynamo_response_ids_are_no_smg_engine_ids() -> None:
    assert "chatcmpl" not in request_keys("x", "chatcmpl-eb323107-ac0f-4939-bb3e-8d3d93993529")
    smg = request_keys("chatcmpl-abc", "chatcmpl-abc-01a22f8f-30b4-76f3-adc2-df33a90d899b")
    assert "chatcmpl-abc" in smg


def test_an_smg_request_is_keyed_without_dynamos_internal_ids() -> None:
    rid, engine = "chatcmpl-abc", "chatcmpl-abc-01a22f8f-30b4-76f3-adc2-df33a90d899b"
    smg = fragment(rid, SOURCE_LOG, 10.0, "smg")
    smg.aliases, smg.trace_id = [engine], "t" * 32
    assert keys_of(smg) == {rid, engine, "trace:" + "t" * 32}
    smg.router_kind = "dynamo"  # Dynamo logs `chatcmpl-<id>`'s id alone on some lines
    assert {"abc", "abc-01a22f8f-30b4-76f3-adc2-df33a90d899b"} < keys_of(smg)


def test_the_better_placed_source_wins_and_says_so() -> None:
    log = frag("r1", SOURCE_LOG, worker="w1", status=200)
    span = frag("r1-01a22f8f-30b4-76f3-adc2-df33a90d899b", SOURCE_OTLP, cached_tokens=0,
                worker="w1")
    span.trace_id = "t" * 32
    tap = frag("r1", SOURCE_TAP, cached_tokens=80, status=200)
    (t,) = merge_all([log, span, tap])
    assert (t.cached_tokens, t.provenance["cached_tokens"]) == (80, "tap")
    assert t.provenance["worker"] == SOURCE_OTLP  # a span outranks a log line
    assert t.sources == ["otlp", "router_log", "tap"]
    assert "trace:" + "t" * 32 in keys_of(t)
    assert not known(t, "prompt_tokens") and known(t, "cached_tokens")


def test_mmlens_own_trace_stays_authoritative() -> None:
    own = RequestTrace("r2", "http://r", "smg", "m", 5.0, False, worker="w2", cached_tokens=16)
    observed = frag("r2", SOURCE_LOG, worker="w9", model="m")
    t = merge(observed, own)
    assert t is own and t.origin == "mmlens" and t.worker == "w2"
    assert known(t, "prompt_tokens")  # mmlens saw the response: nothing is unknown


def test_a_fragment_joining_two_records_merges_them(store_db: str) -> None:
    store = open_store(store_db)
    a = frag("r3", SOURCE_LOG, worker="w1")
    b = frag("other", SOURCE_OTLP, cached_tokens=32)
    b.trace_id = "a" * 32
    store.add_traces([a])
    store.add_traces([b])
    assert len(store.traces(10)) == 2
    bridge = frag("r3", SOURCE_OTLP)
    bridge.trace_id = "a" * 32
    store.add_traces([bridge])
    (t,) = store.traces(10)
    assert (t.worker, t.cached_tokens) == ("w1", 32) and "other" in t.aliases
    store.close()


def test_a_batch_merges_into_a_request_written_earlier_in_it(store_db: str) -> None:
    """One batch: two new requests, then a fragment of the first and a third new one; the
    fragment finds the row its batch wrote a moment before."""
    store = open_store(store_db)
    a, b = frag("r4", SOURCE_LOG, worker="w1"), frag("r5", SOURCE_LOG, worker="w2")
    late, c = frag("r4", SOURCE_OTLP, cached_tokens=16), frag("r6", SOURCE_LOG, worker="w3")
    store.add_traces([a, b, late, c])
    got = {t.request_id: t for t in store.traces(10)}
    assert sorted(got) == ["r4", "r5", "r6"]
    assert (got["r4"].worker, got["r4"].cached_tokens) == ("w1", 16)
    assert store.trace("r6").worker == "w3"
    store.close()


def test_a_model_and_router_no_source_named_print_as_null() -> None:
    from mmlens.ingest.observed import fragment, put

    t = fragment("r1", "router_log", 1.0, "smg")
    assert (t.to_json()["model"], t.to_json()["router"]) == (None, None)
    put(t, "model", "m", "router_log:smg")
    t.router, t.provenance["router"] = "gw", "config:log_file"
    assert (t.to_json()["model"], t.to_json()["router"]) == ("m", "gw")
