"""Router log following: a malformed line is counted, never fatal; a restarted collector goes on
where the last one stopped (no decision stored twice); rotation and truncation start over."""

from __future__ import annotations

import io
import json
import os
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st
from mmlens.collectors.log_follow import LogFollower, StreamFollower
from mmlens.collectors.runner import CollectorRunner

from mmlens.config import Config, RouterTarget
from mmlens.store.sqlite import Store

GOOD = json.dumps({"message": "Event-driven routing", "branch": "event_hit", "worker": "w1",
                   "overlap_blocks": 5, "request_blocks": 5, "span": {"request_id": "r-1"}})
BAD = ("Formula for worker_id=1 dp_rank=0 with 1.2.3 effective cached blocks: 4.5 = "
       "prefill: 1.0 request_id=r-2")


def _runner(db, log) -> CollectorRunner:
    cfg = Config(routers=[RouterTarget("smg", "smg", "http://127.0.0.1:9",
                                       discover_workers=False, log_file=str(log))])
    runner = CollectorRunner(cfg, Store(db))
    runner.setup()
    return runner


def _decisions(db) -> int:
    return _count(db, "decisions")


def _count(db, table: str) -> int:
    store = Store(db)
    try:
        return store.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        store.close()


def test_a_bad_line_is_counted_and_a_restart_does_not_reread(tmp_path) -> None:
    log, db = tmp_path / "smg.log", tmp_path / "s.db"
    log.write_text(f"{GOOD}\n{BAD}\n{{not json\n")
    first = _runner(db, log)
    first.flush()
    errors = first.log_health["smg"].errors
    assert errors.get("malformed_log_line") == 1  # the broken JSON line
    n = _decisions(db)
    assert n == 2  # the good line and the formula line (its bad number left out)
    first.close()
    first.store.close()

    with log.open("a") as fh:
        fh.write(GOOD.replace("r-1", "r-3") + "\n")
    second = _runner(db, log)
    assert second.log_health["smg"].counters["resumed"] == 1
    second.flush()
    assert _decisions(db) == n + 1  # only the new line
    second.close()
    second.store.close()


def test_rotation_truncation_and_bounded_reads(tmp_path) -> None:
    log = tmp_path / "a.log"
    log.write_text("one\ntwo\nthr")
    f = LogFollower(str(log), max_read=5)
    assert f.read_new() == ["one"]  # 5 bytes a call
    assert f.read_new() == ["two"]
    assert f.read_new() == []
    assert f.position()["offset"] == 8  # "thr" is not a line yet
    log.write_text("x\n")  # truncated
    assert f.read_new() == ["x"]
    os.replace(tmp_path / "a.log", tmp_path / "old.log")
    (tmp_path / "a.log").write_text("new1\nnew2\n")  # rotated: another inode
    f.max_read = 1 << 20
    assert f.read_new() == ["new1", "new2"]
    other = LogFollower(str(log))
    assert not other.resume({"inode": -1, "offset": 3})
    assert other.resume(f.position()) and other.read_new() == []


def test_lines_are_numbered_in_order_across_reads_rotation_and_resume(tmp_path) -> None:
    log = tmp_path / "a.log"
    log.write_text("one\n\ntwo\nthr")
    f = LogFollower(str(log), max_read=5)
    start = f.seq
    assert f.read_new() == ["one"] and f.first_seq == start
    assert f.read_new() == ["two"] and f.first_seq == start + 1  # a blank line has none
    os.replace(log, tmp_path / "old.log")
    log.write_text("new1\nnew2\n")  # rotated: numbering goes on
    f.max_read = 1 << 20
    assert f.read_new() == ["new1", "new2"] and f.first_seq == start + 2
    with open(log, "a") as fh:
        fh.write("new3\n")
    other = LogFollower(str(log))  # a restarted collector, from where this one stopped
    assert other.resume(f.position()) and other.read_new() == ["new3"]
    assert other.first_seq == start + 4
    # A log read from scratch later numbers its lines above every earlier reader's.
    assert LogFollower(str(log)).seq > other.seq


def test_a_symlink_swapped_in_for_the_log_is_not_followed(tmp_path) -> None:
    log, secret = tmp_path / "smg.log", tmp_path / "secret"
    log.write_text("one\n")
    secret.write_text("password=hunter2\n")
    f = LogFollower(str(log))
    assert f.read_new() == ["one"]
    log.unlink()
    log.symlink_to(secret)  # after start: refused, counted
    assert f.read_new() == [] and f.read_new() == []
    assert f.refused >= 1
    log.unlink()
    log.write_text("two\n")  # a real file again: read from its start
    assert f.read_new() == ["two"]
    # A symlink the config named from the start is resolved once, as it was then.
    (tmp_path / "link.log").symlink_to(log)
    g = LogFollower(str(tmp_path / "link.log"))
    assert g.read_new() == ["two"] and g.refused == 0


# A served request's line (its span names the request path): a decision and a fragment.
SERVED = GOOD.replace('{"request_id": "r-1"}',
                      '{"request_id": "r-1", "path": "/v1/chat/completions"}')


def _lines(n: int, tag: str) -> str:
    return "".join(SERVED.replace("r-1", f"{tag}-{i}") + "\n" for i in range(n))


def test_one_tick_reads_a_backlog_past_one_read_and_says_what_it_left(tmp_path) -> None:
    log, db = tmp_path / "smg.log", tmp_path / "s.db"
    log.write_text(_lines(300, "a"))
    runner = _runner(db, log)
    follower = runner.followers["smg"]
    follower.max_read = 4096  # ~25 lines a read: the backlog takes a dozen reads
    runner._read_logs(time.monotonic() + 60)
    h = runner.log_health["smg"]
    assert h.counters["lines"] == 300 and h.counters["backlog_bytes"] == 0
    assert _decisions(db) == 300 and not runner.logs_behind()
    # Past its deadline a tick still reads once, and says how much is left.
    with log.open("a") as fh:
        fh.write(_lines(300, "b"))
    runner._read_logs(time.monotonic() - 1)
    left = log.stat().st_size - follower.offset
    assert 0 < left == h.counters["backlog_bytes"] and runner.logs_behind()
    assert 300 < h.counters["lines"] < 600
    runner._read_logs(time.monotonic() + 60)
    assert h.counters["lines"] == 600 and _decisions(db) == 600
    runner.close()
    runner.store.close()


def test_logs_are_read_in_turn_so_a_busy_one_starves_no_other(tmp_path) -> None:
    busy, quiet, db = tmp_path / "busy.log", tmp_path / "quiet.log", tmp_path / "s.db"
    busy.write_text(_lines(400, "busy"))
    quiet.write_text(_lines(3, "quiet"))
    cfg = Config(routers=[RouterTarget(name, "smg", "http://127.0.0.1:9",
                                       discover_workers=False, log_file=str(path))
                          for name, path in (("busy", busy), ("quiet", quiet))])
    runner = CollectorRunner(cfg, Store(db))
    runner.setup()
    for f in runner.followers.values():
        f.max_read = 4096
    runner._read_logs(time.monotonic() - 1)  # one round only
    assert runner.log_health["quiet"].counters["lines"] == 3
    assert 0 < runner.log_health["busy"].counters["lines"] < 400
    runner.close()
    runner.store.close()


def test_a_stream_follower_counts_the_lines_it_had_to_drop(tmp_path) -> None:
    stream = StreamFollower(io.StringIO(_lines(10, "s")), max_buffer=3)
    stream._thread.join(5)
    assert stream.dropped == 7
    cfg = Config(routers=[])
    runner = CollectorRunner(cfg, Store(tmp_path / "s.db"), log_streams={"stdin": stream})
    runner._read_logs(time.monotonic() + 5)
    h = runner.log_health["stdin"]
    assert h.errors["lines_dropped"] == 7 and h.counters["lines"] == 3
    assert _decisions(tmp_path / "s.db") == 3  # the newest three
    runner.close()
    runner.store.close()


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.binary(max_size=40).map(
           lambda b: b.replace(b"!", b"\n").replace(b"#", b"\xe2\x82").replace(b"%", b" ")),
           max_size=12),
       max_read=st.integers(1, 64))
def test_reads_split_anywhere_give_the_lines_each_decoded_alone(tmp_path_factory, pieces,
                                                                max_read) -> None:
    """Whatever the bytes (cut UTF-8 sequences, blank and space-only lines) and however the
    writes and reads split them, the lines read are the file's complete lines, each decoded
    as it would be alone, blank ones left out."""
    log = tmp_path_factory.mktemp("follow") / "x.log"
    log.write_bytes(b"")
    f = LogFollower(str(log), max_read=max_read)
    got: list[str] = []
    for piece in pieces:
        with log.open("ab") as fh:
            fh.write(piece)
        while True:
            lines = f.read_new()
            got += lines
            if not f.backlog:
                break
    whole = b"".join(pieces)
    complete = whole[:whole.rfind(b"\n") + 1].split(b"\n")
    want = [s for s in (b.decode("utf-8", "replace") for b in complete)
            if s and not s.isspace()]
    assert got == want
    assert f.position()["offset"] == whole.rfind(b"\n") + 1


def test_lines_appended_between_ticks_are_stored_within_a_poll_not_at_the_next_tick(
        tmp_path) -> None:
    log, db = tmp_path / "smg.log", tmp_path / "s.db"
    log.write_text("")
    cfg = Config(interval_s=60.0, routers=[RouterTarget(
        "smg", "smg", "http://127.0.0.1:9", discover_workers=False, log_file=str(log))])
    runner = CollectorRunner(cfg, Store(db))
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, kwargs={"stop": stop}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while runner.ticks < 1 and time.monotonic() < deadline:  # the first tick is done
            time.sleep(0.05)
        assert runner.ticks == 1
        with log.open("a") as fh:
            fh.write(_lines(20, "late"))
        appended = time.monotonic()
        while _decisions(db) < 20 and time.monotonic() < appended + 10:
            time.sleep(0.05)
        assert _decisions(db) == 20 and time.monotonic() - appended < 5  # not 60 s
        while _count(db, "traces") < 20 and time.monotonic() < appended + 10:
            time.sleep(0.05)
        assert _count(db, "traces") == 20  # written once held the sink's hold_s
        assert time.monotonic() - appended < 5
        assert runner.ticks == 1  # read and written between ticks
        assert runner.log_health["smg"].counters["lines"] == 20
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    runner.store.close()
