"""The tap never changes what a client gets, whatever the client or the router sends: bodies
nested past any parser's depth, lone surrogate escapes, SSE chunks of the wrong shape. Each
is relayed byte for byte (same status, same body, the stream never cut) and recorded as far
as it can be read; a record that would not read back, or that the store refuses, is
quarantined alone and counted, and the rest of its batch is stored."""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path

import httpx
from mmlens.collectors.store_buffer import BufferedStore
from mmlens.collectors.tap_record import Recorder

from mmlens.cli import tap as tap_cli
from mmlens.ingest.tap_parse import Exchange
from mmlens.records import CollectorHealth, RequestTrace
from mmlens.store.open import open_store
from tests.live_support import free_port, wait_until
from tests.observed.tap_support import DEEP, Served, odd_app, recorded, tap_in_front

SURROGATE_URL = (b'{"model":"m","messages":[{"role":"user","content":[{"type":"image_url",'
                 b'"image_url":{"url":"http://127.0.0.1:9/\\udc80.png"}},'
                 b'{"type":"text","text":"hi \\udc80"}]}]}')
NESTED_BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"x":' + DEEP + b"}"


def exchange(c: httpx.Client, base: str, body: bytes, **headers: str) -> tuple[int, bytes]:
    r = c.post(base + "/v1/chat/completions", content=body,
               headers={"content-type": "application/json", **headers})
    return r.status_code, r.content


def test_malformed_requests_and_answers_pass_unchanged_and_are_recorded() -> None:
    router = Served(odd_app(), free_port())
    cases = [(NESTED_BODY, {}), (SURROGATE_URL, {}), (b'{"model":"m"}', {"x-reply": "sse"}),
             (b'{"model":"m"}', {"x-reply": "deep-json"}), (b"not json at all", {})]
    try:
        with tap_in_front(router.url) as (tap, url, records), httpx.Client() as c:
            for i, (body, headers) in enumerate(cases):
                rid = {"x-request-id": f"case-{i}"}
                direct = exchange(c, router.url, body, **headers, **rid)
                via = exchange(c, url, body, **headers, **rid)
                assert direct[0] == 200 and via == direct, i
            recorded(records, len(cases))
    finally:
        router.stop()
    by_id = {t.request_id: t for t in records}
    assert set(by_id) == {f"case-{i}" for i in range(len(cases))}
    assert by_id["case-0"].model == "" and by_id["case-0"].prompt_tokens == 81
    (im,) = by_id["case-1"].images
    assert im.url_kind == "http" and im.width is None
    sse = by_id["case-2"]
    assert (sse.prompt_tokens, sse.cached_tokens) == (81, 80) and sse.ttft_s is not None
    assert by_id["case-3"].response_id is None and by_id["case-3"].status == 200
    assert tap.health.counters.get("quarantined") is None


def test_a_record_that_would_not_read_back_is_quarantined_alone() -> None:
    """A cache-trace header naming worker 5 (a number) makes a decision the readers cannot
    decode: that record is quarantined and counted; the 50 around it are stored, and so is
    one whose model is a lone surrogate (stored as U+FFFD, so it reads back)."""
    router = Served(odd_app(), free_port())
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "tap.db")
        try:
            with tap_in_front(router.url, write=store.add_traces) as (tap, url, _), \
                    httpx.Client() as c:
                for i in range(50):
                    assert exchange(c, url, b'{"model":"m"}', **{"x-request-id": f"ok-{i}"}
                                    )[0] == 200
                    if i == 20:
                        exchange(c, url, b'{"model":"\\udc80"}', **{"x-request-id": "sur"})
                        exchange(c, url, b'{"model":"m"}', **{"x-request-id": "bad-trace",
                                                               "x-reply": "trace-int-worker"})
            stored = {t.request_id: t for t in store.traces(limit=100)}
        finally:
            store.close()
            router.stop()
    assert set(stored) == {f"ok-{i}" for i in range(50)} | {"sur"}
    assert stored["sur"].model == "\ufffd"
    assert tap.health.counters["recorded"] == 51 and tap.health.counters["quarantined"] == 1
    assert tap.health.errors == {"quarantined_unreadable": 1}
    (q,) = tap.recorder.quarantined  # type: ignore[attr-defined]
    assert q.request_id == "bad-trace" and "decode" in q.reason


def test_one_record_the_store_refuses_does_not_lose_its_batch() -> None:
    written: list[RequestTrace] = []

    def picky(batch: list[RequestTrace]) -> None:
        if any(t.request_id == "poison" for t in batch):
            raise ValueError("the store refuses this one")
        written.extend(batch)

    with tap_in_front(write=picky) as (tap, url, _), httpx.Client() as c:
        for rid in ["a", "b", "poison", "c", "d"]:
            c.post(url + "/v1/chat/completions", json={"model": "m", "messages": []},
                   headers={"x-request-id": rid})
        recorded(written, 4)
    assert sorted(t.request_id for t in written) == ["a", "b", "c", "d"]
    assert tap.health.errors.get("quarantined_store_rejected") == 1


def test_the_store_down_holds_records_spills_them_and_writes_them_when_it_is_back(
        tmp_path: Path) -> None:
    """The collector's outage buffer: two records in memory, the rest spilled to a file while
    a real SQLite store is locked; all written once the lock goes, the file removed (each
    exchange its own batch: a batch is never split to be spilled)."""
    db = tmp_path / "tap.db"
    store = open_store(db)
    store.db.execute("PRAGMA busy_timeout=100")  # locked: down in 0.1 s
    buffer = BufferedStore(store, tmp_path, max_memory=2, backoff=(0.05, 0.2))
    lock = sqlite3.connect(db, isolation_level=None)
    router = Served(odd_app(), free_port())  # a response id of each request's own
    try:
        with tap_in_front(router.url, write=buffer.add_traces, buffer=buffer, linger_s=0.0
                          ) as (tap, url, _), httpx.Client() as c:
            lock.execute("BEGIN EXCLUSIVE")
            for i in range(8):
                r = c.post(url + "/v1/chat/completions", json={"model": "m", "messages": []},
                           headers={"x-request-id": f"r{i}"})
                assert r.status_code == 200
            wait_until(lambda: tap.health.counters.get("store_backlog") == 8, 10, 0.02,
                       what="eight records held")
            c_ = buffer.outage_health.counters  # past two held, the older batches spilled
            assert c_["down"] == 1 and c_["backlog_records"] == 8 and c_["spilled_records"] >= 1
            assert len(list(tmp_path.glob("*.spill"))) == 1
            lock.execute("ROLLBACK")
            wait_until(lambda: tap.health.counters.get("store_backlog") == 0, 10, 0.05,
                       what="the backlog written")
        stored = sorted(t.request_id for t in store.traces(limit=50))
    finally:
        router.stop()
        lock.close()
        store.close()
    assert stored == [f"r{i}" for i in range(8)]
    assert buffer.outage_health.counters["retried_records"] == 8
    assert tap.health.counters["recorded"] == 8 and list(tmp_path.glob("*.spill")) == []


def test_idle_health_is_flushed_without_more_traffic() -> None:
    """The ``recorded`` count on the stored health row catches up with an idle tap."""
    rows: list[dict[str, float]] = []
    with tap_in_front(flush_health=lambda h: rows.append(dict(h.counters))) as (_, url, r), \
            httpx.Client() as c:
        for _ in range(5):
            c.post(url + "/v1/chat/completions", json={"model": "m", "messages": []})
        recorded(r, 5)
        wait_until(lambda: rows[-1].get("recorded") == 5, 5, 0.05, what="health flushed")


def test_the_backlog_is_bounded_in_bytes_and_drops_are_counted() -> None:
    """A store slower than the traffic: exchanges past the byte bound are dropped and
    counted, never queued without end (and the clients' answers are not held up). No
    linger: the first exchange is written alone, the others wait behind it."""
    import threading

    gate = threading.Event()
    written: list[RequestTrace] = []

    def slow(batch: list[RequestTrace]) -> None:
        gate.wait(10)
        written.extend(batch)

    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 20_000}]}
    with tap_in_front(write=slow, max_backlog_bytes=100_000, linger_s=0.0) as (tap, url, _), \
            httpx.Client() as c:
        # the proxy hands an exchange over after the client has its answer: count them, so
        # the drops are read once all 12 are kept or dropped
        handed: list[object] = []
        hand_over = tap.recorder.submit_many
        tap.recorder.submit_many = lambda exs: (hand_over(exs), handed.extend(exs))
        for _ in range(12):
            assert c.post(url + "/v1/chat/completions", json=body).status_code == 200
        wait_until(lambda: len(handed) >= 12, 10, 0.01, what="all 12 handed over")
        dropped = tap.health.counters.get("dropped_backlog", 0)
        gate.set()
        wait_until(lambda: tap.health.counters.get("recorded", 0) + dropped >= 12, 10, 0.02,
                   what="the rest recorded")
    assert 5 <= dropped <= 8  # ~20 kB each: at most five wait (and one being written)
    assert len(written) == 12 - dropped


def _exchange(rid: str, trace_header: str | None = None) -> Exchange:
    headers = {"content-type": "application/json", "x-smg-routed-worker-id": "w1"}
    if trace_header is not None:
        headers["x-smg-cache-trace"] = trace_header
    return Exchange(ts=1.8e9, t0=0.0, body=b'{"model":"m"}', client_request_id=rid, status=200,
                    headers=headers, chunks=[(0.001, b'{"id":"c-' + rid.encode() + b'"}')],
                    kept=12, latency_s=0.001)


def test_the_tap_process_write_path_quarantines_what_its_store_leaves_out(
        tmp_path: Path) -> None:
    """Through ``mmlens tap``'s own write path (outage buffer, SQLite), the store
    is the one that checks a record reads back: it takes 30 of 31, the recorder names the one
    it left out. While the store is down (locked) the recorder checks a batch before the
    buffer holds it, so the unreadable one is never held: once the lock goes the 20 held are
    written."""
    bad = json.dumps({"selections": [{"worker": 5}]})
    args = tap_cli.parse_args(["--upstream", "http://127.0.0.1:9", "--db",
                               str(tmp_path / "t.db"), "--spill-dir", str(tmp_path)])
    health = CollectorHealth("tap", "x")
    write, options = tap_cli.recorder_setup(args, health)
    rec = Recorder(write, health, **options)
    rec.submit_many([_exchange(f"ok-{i}") for i in range(30)] + [_exchange("bad", bad)])
    wait_until(lambda: health.counters.get("recorded") == 30, timeout=10)
    assert health.counters["quarantined"] == 1
    assert [q.request_id for q in rec.quarantined] == ["bad"]
    lock = sqlite3.connect(tmp_path / "t.db", timeout=0)
    lock.execute("BEGIN EXCLUSIVE")  # the store is down for the recorder
    try:
        rec.submit_many([_exchange(f"late-{i}") for i in range(10)])
        wait_until(lambda: options["buffer"].backlog == 10, timeout=30)
        rec.submit_many([_exchange(f"late-{i}") for i in range(10, 20)]
                        + [_exchange("bad2", bad)])
        wait_until(lambda: health.counters.get("quarantined") == 2, timeout=30)
        wait_until(lambda: options["buffer"].backlog == 20, timeout=30)
    finally:
        lock.rollback()
        lock.close()
    wait_until(lambda: options["buffer"].backlog == 0, timeout=60)  # retried, written
    rec.close()
    store = open_store(tmp_path / "t.db")
    try:
        ids = {t.request_id for t in store.traces(limit=100)}
    finally:
        store.close()
    assert ids == {f"ok-{i}" for i in range(30)} | {f"late-{i}" for i in range(20)}
    assert [q.request_id for q in rec.quarantined] == ["bad", "bad2"]
