"""Targets applied while the collectors run: ``mmlens collect --config`` rereads its file
when it changes (the Targets page saves it), so a router or worker added there is collected,
and offered in the Lab, within a tick or two — no restart.

Applied: routers (added, changed, removed: their metrics, state and logs), workers added
(metrics and KV events) and removed (metrics). Not applied until a restart: the interval,
timeout, store limits, Prometheus, OTLP, and the KV subscriptions of removed workers.
"""

from __future__ import annotations

import time
from pathlib import Path

from mmlens.collectors.runner import CollectorRunner

from mmlens.config import Config, ConfigError, apply_ready, load_config, read_ready_file


class ConfigWatcher:
    """Says when a file changed (modification time or size) since it last looked."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._seen = self._stamp()

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def changed(self) -> bool:
        stamp = self._stamp()
        if stamp is None or stamp == self._seen:
            return False
        self._seen = stamp
        return True


def apply_targets(runner: CollectorRunner, new: Config) -> list[str]:
    """The routers and workers of ``new`` in place of the runner's; what changed, one line
    each."""
    if runner.shard is not None:
        return ["a sharded collector keeps its targets until it restarts"]
    notes: list[str] = []
    if new.ready_file:
        try:
            notes += apply_ready(new, read_ready_file(new.ready_file),
                                 Path(new.ready_file).parent)
        except (OSError, ValueError) as exc:
            notes.append(f"ready file: {exc}")
    cfg = runner.cfg
    before = {r.name: r for r in cfg.routers}
    for name, old in before.items():
        now = next((r for r in new.routers if r.name == name), None)
        if now != old:
            runner.followers.pop(name, None)  # followed again below if it still has a log
            notes.append(f"router {name} {'removed' if now is None else 'changed'}")
    notes += [f"router {r.name} added" for r in new.routers if r.name not in before]
    cfg.routers = list(new.routers)
    for r in cfg.routers:
        runner.add_router(r)
    keys = {w.router_url or w.name for w in new.workers}
    configured = {w.router_url or w.name for w in cfg.workers}
    for w in new.workers:
        if (w.router_url or w.name) not in configured and cfg.add_worker(w):
            runner.add_kv_source(w, running=True)
            runner.add_worker_log(w)
            notes.append(f"worker {w.name} added")
    # Only workers the file named go: those a router listed (discovery) stay.
    gone = [w for w in cfg.workers if (w.router_url or w.name) not in keys
            and w.name in runner.configured_workers]
    for w in gone:
        cfg.workers.remove(w)
        notes.append(f"worker {w.name} removed (its KV events are read until a restart)")
    runner.configured_workers = {w.name for w in new.workers}
    runner.store.set_meta("targets", runner.targets())
    return notes


def reload_if_changed(runner: CollectorRunner, watcher: ConfigWatcher) -> list[str]:
    """On a change of the watched file: its targets applied (or, for a file that does not
    load, the collector's health says why and the targets stay)."""
    if not watcher.changed():
        return []
    try:
        new = load_config(watcher.path)
    except ConfigError as exc:
        runner.discovery_health.error("config_reload", str(exc), time.time())
        return [f"{watcher.path.name} not applied: {exc}"]
    notes = apply_targets(runner, new)
    runner.discovery_health.count("config_reloads")
    return notes
