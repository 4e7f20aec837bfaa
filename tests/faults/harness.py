"""Fault injection against the KV collectors: scenarios that drive a vLLM-shaped publisher
(``publisher.py``: it can crash and come back on its ports) and count what reached the store.

Each scenario returns a ``Tally``: events published (valid ones), distinct events stored,
duplicate rows (rows beyond one per published event: every event carries a block hash of
its own, so this does not rely on the store's key), and what the collector's health says.
The test suite runs them small; ``benchmarks/fault_rerun.py`` runs them at the issue's scale.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from mmlens.collectors.runner import CollectorRunner

from mmlens.config import Config, WorkerTarget
from mmlens.store.open import is_postgres_url, open_store
from tests.faults.publisher import FaultPublisher as FaultPublisher
from tests.faults.publisher import GrpcFaultPublisher
from tests.faults.publisher import loopback_endpoints as loopback_endpoints
from tests.live_support import stop_process

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Tally:
    published: int
    stored: int  # distinct published events with a row
    rows: int
    health: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    crashes: int = 0
    dropped: int = 0  # events only a replay could have returned

    @property
    def lost(self) -> int:
        return self.published - self.stored

    @property
    def duplicates(self) -> int:
        return self.rows - self.stored


def count_rows(db: Path | str) -> tuple[int, int]:
    """(rows, distinct first block hashes) of stored events."""
    if is_postgres_url(db):
        import psycopg

        try:
            with psycopg.connect(str(db), connect_timeout=5) as pg:
                rows = pg.execute("SELECT hashes FROM kv_events WHERE kind = 'stored'"
                                  ).fetchall()
        except psycopg.Error:  # down, or no tables yet
            return 0, 0
        return len(rows), len({_dec.decode(h)[0] for (h,) in rows})
    con = sqlite3.connect(db, timeout=10)
    try:
        rows = con.execute("SELECT hashes FROM kv_events WHERE kind = 'stored'").fetchall()
    except sqlite3.OperationalError:  # the collector has not created its tables yet
        return 0, 0
    finally:
        con.close()
    return len(rows), len({_dec.decode(h)[0] for (h,) in rows})


def health_rows(db: Path | str) -> list[dict[str, Any]]:
    import json

    if is_postgres_url(db):
        from mmlens.store.dialect import NoStoreYet
        from mmlens.store.postgres import PostgresStore

        try:
            store = PostgresStore(str(db), readonly=True)
        except NoStoreYet:  # the collector has not created its tables yet
            return []
        try:
            return [{"collector": h.collector, "target": h.target, "errors": h.errors,
                     "counters": h.counters, "instance": h.instance} for h in store.health()]
        finally:
            store.close()
    if not Path(db).exists():
        return []
    con = sqlite3.connect(db, timeout=10)
    try:
        try:
            rows = con.execute("SELECT collector, target, errors, counters, instance "
                               "FROM health").fetchall()
        except sqlite3.OperationalError:
            return []
        return [{"collector": c, "target": t, "errors": json.loads(e),
                 "counters": json.loads(k), "instance": i} for c, t, e, k, i in rows]
    finally:
        con.close()


def quarantined(db: Path | str) -> list[dict[str, Any]]:
    """The bad items the collectors named (``mmlens snapshot --json``'s ``quarantined``)."""
    from mmlens.store.reader import StoreReader

    reader = StoreReader(db)
    try:
        return reader.quarantined()
    finally:
        reader.close()


def tally(pub: FaultPublisher | GrpcFaultPublisher, db: Path | str, started: float,
          crashes: int = 0) -> Tally:
    rows, distinct = count_rows(db)
    return Tally(pub.events, distinct, rows, health_rows(db), time.monotonic() - started,
                 crashes, getattr(pub, "dropped", 0))


def worker_config(pub: FaultPublisher, interval_s: float = 0.2) -> Config:
    endpoint, replay = pub.endpoints
    return Config(workers=[WorkerTarget("w", kv_events=endpoint,
                                        kv_replay=replay if pub.replay_mode else None)],
                  interval_s=interval_s)


@contextmanager
def running_collector(pub: FaultPublisher | GrpcFaultPublisher, db: Path | str,
                      interval_s: float = 0.2, replay_timeout_s: float = 1.0,
                      backoff: tuple[float, float] | None = None,
                      spill_dir: Path | None = None) -> Iterator[CollectorRunner]:
    """``mmlens collect``'s runner on its own thread, stopped (and drained) on exit;
    ``backoff``: the silent replay socket's pauses (default: the collector's)."""
    store = open_store(db)
    config = worker_config(pub, interval_s) if isinstance(pub, FaultPublisher) else Config(
        workers=[WorkerTarget("w", kv_events=pub.url)], interval_s=interval_s)
    runner = CollectorRunner(config, store, spill_dir=spill_dir)
    runner.kv.replay_timeout_s = replay_timeout_s
    if backoff is not None:
        runner.kv.backoff = backoff
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, kwargs={"stop": stop}, daemon=True)
    thread.start()
    try:
        pub.wait_subscribed()
        yield runner
    finally:
        stop.set()
        thread.join(30)
        runner.http.close()
        store.close()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def stored_all(db: Path | str, n: int) -> Callable[[], bool]:
    return lambda: count_rows(db)[1] >= n


def thread_crashes(db: Path) -> int:
    return sum(int(v) for h in health_rows(db) if h["collector"] == "supervisor"
               for k, v in h["counters"].items() if k.startswith("restarts:"))


# --- scenarios -----------------------------------------------------------------------------


def publisher_restart(db: Path, events: int = 5000, down_s: float = 1.0) -> Tally:
    """Half the events, the worker down for ``down_s``, the other half from a new incarnation
    published at once (the first batches reach nobody: the SUB socket is reconnecting)."""
    pub = FaultPublisher(*loopback_endpoints(2)).up()
    t0 = time.monotonic()
    try:
        with running_collector(pub, db):
            pub.stream(events // 2)
            wait_for(stored_all(db, events // 2), 20, "first half stored")
            pub.down()
            time.sleep(down_s)
            pub.up()
            pub.stream(events - events // 2)
            wait_for(stored_all(db, events), 20, "second half stored")
        return tally(pub, db, t0)
    finally:
        pub.close()


def gaps(db: Path, events: int = 5000, replay: str | None = "answer", every: int = 50,
         offset: int | None = None, silent_s: float = 3.0,
         backoff: tuple[float, float] | None = None) -> Tally:
    """Batches with ``seq % every == offset`` (default: mid-period) lost on the way; replay
    answers, is lossy, is silent (never answers), is absent, or is "silent_then_answers":
    silent from the first batch on for ``silent_s``, then answering."""
    offset = every // 2 if offset is None else offset
    late = replay == "silent_then_answers"
    pub = FaultPublisher(*loopback_endpoints(2),
                         replay_mode="answer" if late else replay).up()
    t0 = time.monotonic()
    try:
        with running_collector(pub, db, replay_timeout_s=0.5, backoff=backoff):
            if late:
                pub.silent_until = time.monotonic() + silent_s
            pub.stream(events, drop=lambda seq: seq % every == offset)
            if replay in ("answer", "lossy"):
                wait_for(stored_all(db, events), 20, "all stored")
            elif late:
                wait_for(stored_all(db, events), 30 + silent_s, "all stored late")
        return tally(pub, db, t0)  # stopped right away: nothing read may be dropped
    finally:
        pub.close()


def garbage(db: Path, events: int = 2000) -> tuple[Tally, dict[str, int]]:
    """Valid batches interleaved with every kind of bad frame, live and in the replay buffer
    (a payload nested 100,000 deep among them). Returns the tally and what was injected."""
    pub = FaultPublisher(*loopback_endpoints(2)).up()
    injected = {"truncated_frame": 0, "oversize_number": 0, "undecodable_msgpack": 0,
                "too_deep": 0, "bad_batch": 0}
    deep = b"\x91" * 100_000 + b"\x00"
    t0 = time.monotonic()
    try:
        with running_collector(pub, db):
            for i in range(events // 4):
                pub.publish(pub.batch(4))
                kind = i % 5
                if kind == 0:
                    pub.send_raw([b"", b"\x00\x01"])
                    injected["truncated_frame"] += 1
                elif kind == 1:
                    pub.publish(b"", seq=(1 << 63) + i)
                    injected["oversize_number"] += 1
                elif kind == 2 and i % 50 == 2:
                    # in the buffer, lost live: only the replay hands it over
                    pub.publish(deep, send=False)
                    injected["too_deep"] += 1
                elif kind == 3:
                    pub.publish(b"\xc1\xc1\xc1")
                    injected["undecodable_msgpack"] += 1
                elif kind == 4:
                    pub.publish(_enc.encode({"no": "events"}))
                    injected["bad_batch"] += 1
            wait_for(stored_all(db, pub.events), 20, "valid events stored")
            wait_for(lambda: sum(runner_errors(db).values()) >= sum(injected.values()), 10,
                     "garbage counted")
        return tally(pub, db, t0, thread_crashes(db)), injected
    finally:
        pub.close()


def runner_errors(db: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for h in health_rows(db):
        if h["collector"] == "kv_events":
            for k, v in h["errors"].items():
                out[k] = out.get(k, 0) + v
    return out


def two_collectors(db: Path, events: int = 5000) -> Tally:
    pub = FaultPublisher(*loopback_endpoints(2)).up()
    t0 = time.monotonic()
    try:
        with running_collector(pub, db), running_collector(pub, db):
            pub.stream(events)
            wait_for(stored_all(db, events), 20, "all stored")
            time.sleep(0.5)  # both have stored what they read
        return tally(pub, db, t0)
    finally:
        pub.close()


def collect_process(config: Path, db: Path | str, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "mmlens", "collect", "--config", str(config), "--db", str(db),
         "--interval", "0.2", *args], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)


def spilled(folder: Path) -> int:
    """Records in the spill files in ``folder``."""
    from mmlens.collectors.spill_file import SpillFile

    return sum(SpillFile(p).records() for p in folder.glob("*.spill"))


def kill9_with_backlog(db: str, tmp: Path, down: Callable[[], None], up: Callable[[], None],
                       events: int = 12_000, buffer_records: int = 1_000,
                       rate: float = 4_000.0) -> Tally:
    """``mmlens collect`` killed with SIGKILL while the store is down and most of its backlog
    is spilled, the store back, a new collector on the same spill folder. The worker's
    replay buffer holds the last quarter of the batches only (what the killed collector held
    in memory and more): the rest reaches the store from the spill file or not at all."""
    pub = FaultPublisher(*loopback_endpoints(2), buffer_steps=events // 16).up()
    endpoint, replay = pub.endpoints
    config = tmp / "faults.toml"
    config.write_text(f'[[worker]]\nname = "w"\nkv_events = "{endpoint}"\n'
                      f'kv_replay = "{replay}"\n')
    spill = tmp / "spill"
    spill.mkdir()
    args = ("--spill-dir", str(spill), "--buffer-records", str(buffer_records))
    t0 = time.monotonic()
    proc = collect_process(config, db, *args)
    try:
        wait_for(lambda: health_rows(db), 30, "collector running")
        pub.wait_subscribed()
        down()
        pub.stream(events, rate=rate)
        wait_for(lambda: spilled(spill) >= events - 4 * pub.buffer_steps, 60,
                 "the backlog spilled")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        up()
        proc = collect_process(config, db, *args)
        wait_for(stored_all(db, events), 60, "all stored after the restart")
        wait_for(lambda: not list(spill.glob("*.spill")), 30, "the spill file written")
        time.sleep(0.6)  # a tick writes the health rows
        return tally(pub, db, t0)
    finally:
        stop_process(proc, timeout=20)
        pub.close()


def kill9_mid_write(db: Path, tmp: Path, events: int = 20_000, rate: float = 20_000.0,
                    kills: int = 1) -> Tally:
    """``mmlens collect`` killed with SIGKILL while it writes, then started again: its initial
    replay hands over the whole buffer again."""
    pub = FaultPublisher(*loopback_endpoints(2), buffer_steps=max(10_000, events)).up()
    endpoint, replay = pub.endpoints
    config = tmp / "faults.toml"
    config.write_text(f'[[worker]]\nname = "w"\nkv_events = "{endpoint}"\n'
                      f'kv_replay = "{replay}"\n')
    t0 = time.monotonic()
    proc = collect_process(config, db)
    try:
        wait_for(lambda: health_rows(db), 30, "collector running")
        feeder = threading.Thread(target=pub.stream, args=(events,), kwargs={"rate": rate})
        feeder.start()
        for k in range(kills):
            wait_for(lambda k=k: count_rows(db)[1] > events * (k + 1) // (kills + 2), 60,
                     "collector writing")
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            proc = collect_process(config, db)
        feeder.join()
        wait_for(stored_all(db, events), 60, "all stored after the restart")
        return tally(pub, db, t0)
    finally:
        stop_process(proc, timeout=20)
        pub.close()


def _caught_up(db: Path | str, events: int, last_seq: int) -> None:
    """Wait until every valid event published is stored and the KV stream's health row is
    at the publisher's last sequence number."""
    wait_for(stored_all(db, events), 20, "valid events stored")
    wait_for(lambda: any(r["counters"].get("last_seq") == last_seq
                         for r in health_rows(db) if r["collector"] == "kv_events"),
             10, "stream at its last batch")


def poisoned(db: Path | str, batches: int = 2000, bad_every: int = 400,
             bad_offset: int = 1 << 31, bad_ts: float | None = None,
             bad_id: bytes | None = None) -> tuple[Tally, list[int]]:
    """``batches`` of 4 events; in every ``bad_every``-th one the first event's image offset is
    ``bad_offset`` (a stored event the rest of the pipeline cannot take), or with ``bad_id``
    its image id is those 32 bytes (not UTF-8: a lone surrogate's escape), or with ``bad_ts``
    the batch's time is that (its one event set aside with it). Published counts the valid
    events only; returns the tally and the seqs of the poisoned batches."""
    pub = FaultPublisher(*loopback_endpoints(2)).up()
    poisoned_seqs: list[int] = []
    t0 = time.monotonic()
    try:
        with running_collector(pub, db):
            for i in range(batches):
                if i % bad_every == bad_every // 2 and bad_ts is not None:
                    event = _dec.decode(pub.batch(1))[1]
                    pub.events -= 1  # not a valid event: its batch has no valid time
                    poisoned_seqs.append(pub.publish(_enc.encode([bad_ts, event, 0])))
                elif i % bad_every == bad_every // 2:
                    image = "Z" * 32 if bad_id is not None else "ab" * 16
                    bad = {"type": "BlockStored", "block_hashes": [(1 << 62) + i],
                           "parent_block_hash": None, "token_ids": [7] * 16,
                           "block_size": 16, "medium": "GPU",
                           "extra_keys": [[[image, 0 if bad_id is not None else bad_offset]]]}
                    events = _dec.decode(pub.batch(3))
                    events[1].insert(0, bad)
                    payload = _enc.encode(events)
                    if bad_id is not None:  # the same str header, bytes no decoder takes
                        payload = payload.replace(b"Z" * 32, bad_id)
                    poisoned_seqs.append(pub.publish(payload))
                else:
                    pub.publish(pub.batch(4))
                if i % 50 == 0:
                    time.sleep(0.005)
            _caught_up(db, pub.events, pub.seq - 1)
        return tally(pub, db, t0, thread_crashes(db)), poisoned_seqs
    finally:
        pub.close()


def poisoned_grpc(db: Path | str, batches: int = 2000, bad_every: int = 400,
                  bad_offset: int = 1 << 40) -> tuple[Tally, list[int]]:
    """``poisoned`` over a gRPC worker's SubscribeKvEvents stream (``GrpcFaultPublisher``):
    ``batches`` of 4 stored events, the first event of every ``bad_every``-th one with an
    image key whose ``multimodal.offset`` is ``bad_offset``. Returns the tally and the gRPC
    sequence numbers of the poisoned batches."""
    pub = GrpcFaultPublisher()
    poisoned_seqs: list[int] = []
    t0 = time.monotonic()
    try:
        with running_collector(pub, db):
            for i in range(batches):
                events = [pub.stored() for _ in range(4)]
                if i % bad_every == bad_every // 2:
                    events[0] = pub.stored(("ab" * 16, bad_offset))
                    poisoned_seqs.append(pub.publish(events, valid=3))
                else:
                    pub.publish(events)
                if i % 50 == 0:
                    time.sleep(0.005)
            _caught_up(db, pub.events, batches)
        return tally(pub, db, t0, thread_crashes(db)), poisoned_seqs
    finally:
        pub.close()


def outage(db: Path | str, tmp: Path, down: Callable[[], None], up: Callable[[], None],
           events: int = 20_000, rate: float = 5_000.0, down_s: float = 3.0,
           max_memory: int | None = None) -> Tally:
    """Events streamed at ``rate`` while the store goes ``down()`` for ``down_s`` (mid-stream)
    and comes back ``up()``; the collector's backlog (``max_memory`` records in memory, the rest
    spilled to ``tmp``) must reach the store."""
    pub = FaultPublisher(*loopback_endpoints(2), buffer_steps=events).up()
    t0 = time.monotonic()
    try:
        with running_collector(pub, db, spill_dir=tmp) as runner:
            runner.store.backoff = (0.2, 1.0)
            if max_memory is not None:
                runner.store.max_memory = max_memory
            feeder = threading.Thread(target=pub.stream, args=(events,), kwargs={"rate": rate})
            feeder.start()
            wait_for(lambda: count_rows(db)[1] > events // 5, 60, "collector writing")
            down()
            wait_for(lambda: runner.store.down_since is not None, 30, "outage noticed")
            time.sleep(down_s)
            up()
            feeder.join()
            wait_for(stored_all(db, events), 60, "all stored after the outage")
            time.sleep(2 * 0.2)  # a last tick writes the health rows
        return tally(pub, db, t0, thread_crashes(db))
    finally:
        pub.close()
