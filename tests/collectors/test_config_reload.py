"""`mmlens collect --config` applies a changed file while it runs: routers added, changed and
removed, workers added and removed, a file that does not load refused with its reason."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
from mmlens.collectors.config_reload import ConfigWatcher, reload_if_changed
from mmlens.collectors.runner import CollectorRunner

from mmlens.config import load_config
from mmlens.store.sqlite import Store

ROUTER = '[[router]]\nname = "{name}"\nkind = "smg"\nurl = "http://127.0.0.1:{port}"\n' \
         'metrics_url = "http://127.0.0.1:{port}/metrics"\ndiscover_workers = false\n'
WORKER = '[[worker]]\nname = "{name}"\nrouter_url = "grpc://127.0.0.1:{port}"\n' \
         'metrics_url = "http://127.0.0.1:{port}/metrics"\nkv_events = "tcp://127.0.0.1:{port}"\n'


def _write(path: Path, *blocks: str) -> None:
    path.write_text("interval_s = 1\n" + "\n".join(blocks))
    st = path.stat()  # a new stamp even within the file system's time resolution
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_a_saved_config_reaches_the_running_collector(tmp_path: Path) -> None:
    cfg_path, db = tmp_path / "mmlens.toml", tmp_path / "s.db"
    _write(cfg_path, ROUTER.format(name="demo", port=9))
    store = Store(db)
    with httpx.Client(timeout=0.2) as http:
        runner = CollectorRunner(load_config(cfg_path), store, http=http)
        runner.setup()
        watcher = ConfigWatcher(cfg_path)
        assert reload_if_changed(runner, watcher) == []  # nothing changed yet
        _write(cfg_path, ROUTER.format(name="demo", port=9), ROUTER.format(name="two", port=11),
               WORKER.format(name="w1", port=13))
        notes = reload_if_changed(runner, watcher)
        assert notes == ["router two added", "worker w1 added"]
        assert [r["name"] for r in store.meta("targets")["routers"]] == ["demo", "two"]
        assert ("two", "http://127.0.0.1:11/metrics") in runner.metric_targets()
        assert [ep.endpoint for ep in runner.kv.endpoints] == ["tcp://127.0.0.1:13"]

        _write(cfg_path, ROUTER.format(name="two", port=12))
        assert reload_if_changed(runner, watcher) == [
            "router demo removed", "router two changed",
            "worker w1 removed (its KV events are read until a restart)"]
        assert [(r.name, r.url) for r in runner.cfg.routers] == [("two", "http://127.0.0.1:12")]
        assert runner.cfg.workers == []

        cfg_path.write_text('[[router]]\nname = "x"\nurl = "not a url"\n')
        (note,) = reload_if_changed(runner, watcher)
        assert note.startswith("mmlens.toml not applied:") and "url" in note
        assert [r.name for r in runner.cfg.routers] == ["two"]  # kept
        assert runner.discovery_health.errors.get("config_reload") == 1
        runner.close()
    store.close()
