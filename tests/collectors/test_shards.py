"""`mmlens collect --shard I/N`: a stable split of the workers, each worker's KV events stored
exactly once by two collector processes sharing one store, per-shard health."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
import zmq

from mmlens.cli import collect as collect_cli
from mmlens.config import WorkerTarget
from mmlens.shard import Shard, ShardError, parse_label, parse_shard, shard_of
from mmlens.store.open import open_store
from tests.collectors.zmq_publisher import Publisher
from tests.live_support import REPO, loopback_endpoints, stop_process, wait_until

IDS = [f"grpc://10.0.{i // 250}.{i % 250}:50051" for i in range(1000)]


def test_shard_of_is_the_same_in_every_process() -> None:
    code = ("import json,sys; from mmlens.shard import shard_of; "
            "print(json.dumps([shard_of(i, 7) for i in json.load(sys.stdin)]))")
    answers = []
    for seed in ("1", "2"):  # str hash() differs between these two; shard_of must not
        out = subprocess.run([sys.executable, "-c", code], input=json.dumps(IDS), text=True,
                             capture_output=True, check=True,
                             env=os.environ | {"PYTHONHASHSEED": seed})
        answers.append(json.loads(out.stdout))
    assert answers[0] == answers[1] == [shard_of(i, 7) for i in IDS]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_shards_split_the_workers_without_overlap(n: int) -> None:
    workers = [WorkerTarget(name=f"w{i}", router_url=u) for i, u in enumerate(IDS)]
    owners = [[s for s in range(n) if Shard(s, n).owns(w)] for w in workers]
    assert all(len(o) == 1 for o in owners)
    sizes = Counter(o[0] for o in owners)
    assert sorted(sizes) == list(range(n))
    assert max(sizes.values()) < 1.25 * len(workers) / n  # roughly even
    # A worker without a router URL is known by its name.
    assert Shard(shard_of("solo", n), n).owns(WorkerTarget(name="solo"))


def test_shard_argument_errors(tmp_path, capsys) -> None:
    assert parse_shard("3/4") == Shard(3, 4) and parse_shard("0/1").leads
    for bad in ("4/4", "-1/2", "1", "a/b", "1/0", ""):
        with pytest.raises(ShardError, match="I/N"):
            parse_shard(bad)
    assert parse_label("1/2") == Shard(1, 2) and parse_label("config") is None
    assert collect_cli.main(["--db", str(tmp_path / "s.db"), "--shard", "2/2"]) == 2
    assert "0 <= I < N" in capsys.readouterr().err
    assert not (tmp_path / "s.db").exists()


def _publish(pubs: list[Publisher], stop: threading.Event) -> None:
    step = 0
    while not stop.is_set():
        step += 1
        for i, pub in enumerate(pubs):
            pub.publish([time.time(), [{"type": "BlockStored", "block_hashes": [i << 32 | step],
                                        "parent_block_hash": None, "token_ids": [1] * 16,
                                        "block_size": 16}], 0])
        time.sleep(0.05)


def _shards_up(db: str, procs: list[subprocess.Popen[bytes]]) -> bool:
    for p in procs:
        if p.poll() is not None:
            pytest.fail(p.stderr.read().decode() if p.stderr else "a collector exited")
    store = open_store(db, readonly=True)
    try:
        return sum(h.collector == "shard" for h in store.health()) == 2
    finally:
        store.close()


@pytest.mark.slow
def test_two_collector_processes_store_each_worker_once(tmp_path, store_db: str) -> None:
    """On SQLite and on PostgreSQL (`--db postgresql://…`)."""
    ctx = zmq.Context()
    n = 6
    eps = loopback_endpoints(2 * n)
    pubs = [Publisher(ctx, eps[2 * i], eps[2 * i + 1]) for i in range(n)]
    workers = "".join(
        f'[[worker]]\nname = "w{i}"\nrouter_url = "grpc://127.0.0.1:{51000 + i}"\n'
        f'kv_events = "{eps[2 * i]}"\nkv_replay = "{eps[2 * i + 1]}"\n' for i in range(n))
    (tmp_path / "mmlens.toml").write_text(f"interval_s = 0.3\ntimeout_s = 0.5\n{workers}")
    db = store_db
    stop = threading.Event()
    feeder = threading.Thread(target=_publish, args=(pubs, stop), daemon=True)
    procs = [subprocess.Popen(
        [sys.executable, "-m", "mmlens", "collect", "--config", str(tmp_path / "mmlens.toml"),
         "--db", db, "--duration", "4", "--shard", f"{s}/2"], cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for s in range(2)]
    try:
        # Publish once both collectors run: the lag asserted below is the pipeline's, not
        # their start-up (importing the collector alone takes 3-6 s on a loaded 2-core
        # machine, and events published before it would be that much older when stored).
        wait_until(lambda: _shards_up(db, procs), 60, 0.1, what="both shards' health rows",
                   ignore=(Exception,))
        feeder.start()
        for p in procs:
            assert p.wait(timeout=60) == 0, p.stderr.read().decode() if p.stderr else ""
    finally:
        stop.set()
        if feeder.is_alive():
            feeder.join()
        for p in procs:
            stop_process(p)
        for pub in pubs:
            pub.close()
        ctx.destroy(linger=0)

    store = open_store(db, readonly=True)
    rows = [(r.worker, r.seq) for r in store.kv_event_rows(None, hashes=False)]
    health = {h.target: (h.counters, h.last_success) for h in store.health()
              if h.collector == "shard"}
    targets = store.meta("targets")
    store.close()
    per_worker: dict[str, list[int]] = {}
    for worker, seq in rows:
        per_worker.setdefault(worker, []).append(seq)
    assert len(per_worker) == n  # every worker collected …
    for worker, seqs in per_worker.items():  # … once: each batch from seq 0 on, no repeats
        assert sorted(seqs) == list(range(len(seqs))), worker
    assert sorted(health) == ["0/2", "1/2"]
    assert sum(c["workers"] for c, _ in health.values()) == n
    assert all(c["fleet_workers"] == n and c["ticks"] > 1 and last for c, last in
               health.values())
    assert sum(c.get("kv_events", 0) for c, _ in health.values()) == len(rows)
    # Publisher timestamp → committed: at least the drain interval's wait, well under 10 s.
    assert all(0 < c["store_lag_p50_s"] <= c["store_lag_p99_s"] <= c["store_lag_max_s"] < 10
               for c, _ in health.values() if c["workers"])
    for label, (c, _) in health.items():
        shard = parse_shard(label)
        owned = {w for w in per_worker if shard_of(w, 2) == shard.index}
        assert c["workers"] == len(owned)
    assert len(targets["workers"]) == n  # shard 0 describes the whole fleet
