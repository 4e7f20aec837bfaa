"""Router log following: a malformed line is counted, never fatal; a restarted collector goes on
where the last one stopped (no decision stored twice); rotation and truncation start over."""

from __future__ import annotations

import json
import os

from mmlens.collectors.log_follow import LogFollower
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
    store = Store(db)
    try:
        return store.db.execute("SELECT count(*) FROM decisions").fetchone()[0]
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
