"""Fault injection against the KV collectors (see ``harness``): nothing lost, nothing stored
twice, every bad input counted, the collector alive throughout."""

from __future__ import annotations

import threading
import time

import pytest
from mmlens.collectors.supervisor import supervise

from mmlens.records import CollectorHealth
from tests.faults import harness as h

pytestmark = pytest.mark.faults


def kv_health(t: h.Tally) -> dict:
    (row,) = [r for r in t.health if r["collector"] == "kv_events"]
    return row


def report(name: str, t: h.Tally, db) -> None:
    """The fault's row: counts, and what the KV health row and ``quarantined`` say."""
    c, named = kv_health(t)["counters"], [q for q in h.quarantined(db)
                                          if q["collector"] == "kv_events"]
    print(f"\n{name}: published {t.published} stored {t.stored} lost {t.lost} duplicates "
          f"{t.duplicates} quarantined {len(named)}; health errors {kv_health(t)['errors']}, "
          f"last_seq {c.get('last_seq')}, lost_batches {c.get('lost_batches', 0)}; "
          f"quarantined[0] {named[0] if named else None}")


def test_publisher_restart_loses_nothing(tmp_path) -> None:
    t = h.publisher_restart(tmp_path / "s.db", events=2000, down_s=0.5)
    assert (t.lost, t.duplicates) == (0, 0)
    c = kv_health(t)["counters"]
    assert c["restarts"] >= 1 or c.get("reconnects", 0) >= 1
    assert c["stored_events"] == 2000 and c["lost_batches"] == 0
    assert c["published_batches"] == c["batches"]


@pytest.mark.parametrize("replay", ["answer", "lossy", "silent", None])
def test_gaps_with_and_without_replay(tmp_path, replay) -> None:
    started = time.monotonic()
    t = h.gaps(tmp_path / "s.db", events=2000, replay=replay, every=25)
    batches = 500  # 2000 events, 4 a batch
    dropped_events = (batches // 25) * 4
    assert t.duplicates == 0
    c, errors = kv_health(t)["counters"], kv_health(t)["errors"]
    if replay in ("answer", "lossy"):
        assert t.lost == 0 and c["lost_batches"] == 0 and "unrecovered_gap" not in errors
    else:
        # Exactly the batches lost on the way are missing, and health says so.
        assert t.lost == dropped_events
        assert c["lost_batches"] == batches // 25 == c["published_batches"] - c["batches"]
        assert errors["unrecovered_gap"] >= 1
    if replay == "silent":
        assert errors["replay_timeout"] >= 1
        # Owed until the collector stopped (asked a last time then), and said so.
        assert c["given_up_batches:stop"] == batches // 25 and c["owed_batches"] == 0
        assert c["max_held_s"] < 0.5 + 1.0  # live batches waited one replay deadline at most
    assert time.monotonic() - started < 20  # a silent replay never held the stream for long


def test_a_replay_silent_past_its_deadline_then_answering_loses_nothing(tmp_path) -> None:
    t = h.gaps(tmp_path / "s.db", events=2000, replay="silent_then_answers", every=25,
               silent_s=1.0, backoff=(1.0, 300.0))
    assert (t.lost, t.duplicates) == (0, 0)
    c, errors = kv_health(t)["counters"], kv_health(t)["errors"]
    assert errors["replay_timeout"] >= 1  # it was silent past the replay's deadline
    assert c["late_recovered_batches"] == 500 // 25 and c["replayed_batches"] == 0
    assert (c["lost_batches"], c["owed_batches"]) == (0, 0) and "unrecovered_gap" not in errors
    assert c["published_batches"] == c["batches"] == 500


def test_a_lost_last_batch_is_found_by_the_idle_probe(tmp_path) -> None:
    # seq 499 (the last) is among the lost: no later batch reveals it, the idle probe does.
    t = h.gaps(tmp_path / "s.db", events=2000, replay="answer", every=25, offset=24)
    assert (t.lost, t.duplicates) == (0, 0)
    assert kv_health(t)["counters"]["tail_probes"] >= 1


def test_garbage_is_counted_and_valid_events_all_stored(tmp_path) -> None:
    t, injected = h.garbage(tmp_path / "s.db", events=1000)
    assert (t.lost, t.duplicates, t.crashes) == (0, 0, 0)
    errors = kv_health(t)["errors"]
    for kind, n in injected.items():
        assert errors.get(kind, 0) >= n, kind
    assert "internal_error" not in errors


def test_two_collectors_on_one_store(tmp_path) -> None:
    t = h.two_collectors(tmp_path / "s.db", events=2000)
    assert (t.lost, t.duplicates) == (0, 0)
    rows = [r for r in t.health if r["collector"] == "kv_events"]
    assert len(rows) == 2 and len({r["instance"] for r in rows}) == 2
    stored = sorted(r["counters"]["stored_events"] for r in rows)
    assert sum(stored) == 2000  # each event written by one, ignored by the other
    assert all(r["counters"]["stored_events"] + r["counters"].get("duplicate_events", 0)
               == 2000 for r in rows)


def test_kill_9_mid_write_then_restart(tmp_path) -> None:
    t = h.kill9_mid_write(tmp_path / "s.db", tmp_path, events=8000, rate=8000.0)
    assert (t.lost, t.duplicates) == (0, 0)


def test_a_crashed_collector_thread_is_restarted_and_reported() -> None:
    health = CollectorHealth("supervisor", "collect")
    stop, runs = threading.Event(), []

    def work() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RecursionError("maximum recursion depth exceeded")
        stop.wait()

    thread = threading.Thread(target=supervise, args=("kv-events", work, stop, health,
                                                      (0.01, 0.05)))
    thread.start()
    h.wait_for(lambda: len(runs) == 3, 5, "third run")
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    assert health.counters == {"restarts:kv-events": 2}
    assert health.errors == {"thread_crashed:kv-events": 2}
    assert "RecursionError" in (health.last_error or "")


def test_runner_restarts_its_kv_thread_and_keeps_storing(tmp_path) -> None:
    pub = h.FaultPublisher(*h.loopback_endpoints(2)).up()
    db = tmp_path / "s.db"
    try:
        with h.running_collector(pub, db) as runner:
            real_poll, calls = runner.kv.poll, []

            def failing_poll(*args, **kwargs):
                calls.append(1)
                if len(calls) == 1:
                    raise MemoryError("injected")
                return real_poll(*args, **kwargs)

            runner.kv.poll = failing_poll
            pub.stream(1000)
            h.wait_for(h.stored_all(db, 1000), 20, "stored after the crash")
            h.wait_for(lambda: h.thread_crashes(db) == 1, 5, "crash reported")
        sup = next(r for r in h.health_rows(db) if r["collector"] == "supervisor")
        assert sup["errors"] == {"thread_crashed:kv-events": 1}
    finally:
        pub.close()


@pytest.mark.parametrize("offset", [1 << 31, 1 << 63, -(1 << 40)])
def test_a_bad_event_is_quarantined_alone_and_the_stream_moves_past_it(tmp_path,
                                                                       offset) -> None:
    t, seqs = h.poisoned(tmp_path / "s.db", batches=2000, bad_every=400, bad_offset=offset)
    report(f"KV image offset {offset}", t, tmp_path / "s.db")
    assert (t.lost, t.duplicates, t.crashes) == (0, 0, 0)
    row = kv_health(t)
    c, errors = row["counters"], row["errors"]
    # The bad events, and nothing else bad (a replay may time out on a loaded machine).
    assert errors["oversize_number"] == len(seqs), errors
    assert not set(errors) - {"oversize_number", "replay_timeout"}, errors
    assert c["replays"] <= 3 and c["lost_batches"] == 0  # no batch asked for again and again
    assert c["batches"] == c["published_batches"] == 2000 and c["last_seq"] == 1999
    assert c["stored_events"] == t.published
    named = [q for q in h.quarantined(tmp_path / "s.db") if q["collector"] == "kv_events"]
    assert [q["where"] for q in named] == [f"w#0 seq {s} event 0" for s in seqs]
    assert all(q["kind"] == "oversize_number" and str(offset) in q["detail"] for q in named)


def test_a_grpc_image_offset_of_2_40_is_quarantined_alone(tmp_path) -> None:
    """The issue's gRPC row: ``multimodal.offset = 2**40`` in one event of every 400th of
    2,000 batches, over a real SubscribeKvEvents stream read by ``mmlens collect``'s runner."""
    t, seqs = h.poisoned_grpc(tmp_path / "s.db", batches=2000, bad_every=400)
    report("gRPC KV image offset 2**40", t, tmp_path / "s.db")
    assert (t.lost, t.duplicates, t.crashes) == (0, 0, 0)
    row = kv_health(t)
    c = row["counters"]
    assert row["errors"] == {"oversize_number": len(seqs)} and len(seqs) == 5
    assert c["batches"] == 2000 and c["last_seq"] == 2000 and c["transport_grpc"] == 1
    assert "gaps" not in c and "restarts" not in c  # one subscription, read through once
    assert c["events"] == t.published == t.stored
    named = [q for q in h.quarantined(tmp_path / "s.db") if q["collector"] == "kv_events"]
    assert [q["where"] for q in named] == [f"w#0 seq {s} event 0" for s in seqs]
    assert all(q["kind"] == "oversize_number" and str(1 << 40) in q["detail"] for q in named)


def test_an_image_id_that_is_not_utf8_takes_only_its_event(tmp_path) -> None:
    """vLLM's image id as a msgpack str whose bytes are a lone surrogate's UTF-8 escape."""
    bad_id = b"\xed\xb2\x80" * 10 + b"ab"
    t, seqs = h.poisoned(tmp_path / "s.db", batches=2000, bad_every=400, bad_id=bad_id)
    report("KV image id not UTF-8", t, tmp_path / "s.db")
    assert (t.lost, t.duplicates, t.crashes) == (0, 0, 0)
    row = kv_health(t)
    assert row["counters"]["last_seq"] == 1999 and row["counters"]["lost_batches"] == 0
    assert sum(v for k, v in row["errors"].items() if k != "replay_timeout") == len(seqs)
    named = [q for q in h.quarantined(tmp_path / "s.db") if q["collector"] == "kv_events"]
    assert [q["where"] for q in named] == [f"w#0 seq {s} event 0" for s in seqs]


@pytest.mark.parametrize("ts", [float("inf"), 1e300])
def test_a_batch_with_an_impossible_time_on_postgresql_takes_only_itself(
        tmp_path, postgres, ts) -> None:
    from tests.conftest import new_database

    url = new_database(postgres)
    t, seqs = h.poisoned(url, batches=2000, bad_every=400, bad_ts=ts)
    report(f"KV batch ts={ts} on PostgreSQL", t, url)
    assert (t.lost, t.duplicates, t.crashes) == (0, 0, 0)
    row = kv_health(t)
    assert row["errors"]["bad_number"] == len(seqs), row["errors"]
    assert not set(row["errors"]) - {"bad_number", "replay_timeout"}, row["errors"]
    assert row["counters"]["last_seq"] == 1999 and row["counters"]["lost_batches"] == 0
    named = [q for q in h.quarantined(url) if q["collector"] == "kv_events"]
    assert [q["where"] for q in named] == [f"w#0 seq {s}" for s in seqs]
