"""`mmlens dashboard --demo` starts demo, collectors and Streamlit, serves deep links, and on
Ctrl-C (SIGINT to its process group, as a terminal sends it) leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.live_support import REPO, free_port, free_port_base, ready_info, wait_until

pytestmark = [pytest.mark.live, pytest.mark.slow]


def descendants(pid: int) -> set[int]:
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        for k in map(int, kids):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_ctrl_c_stops_every_child(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmlens", "dashboard", "--demo", "--no-warmup", "--port",
         str(port), "--port-base", str(free_port_base(50)), "--db", str(tmp_path / "m.db"),
         "--ready-file", str(ready)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        url = wait_until(lambda: ready_info(ready, proc), 90, 0.3, what="dashboard ready")[
            "dashboard"]
        wait_until(lambda: httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200,
                   30, 0.3, what="Streamlit healthy", ignore=(httpx.HTTPError,))
        # A deep link is served by the app (the page itself renders client-side).
        assert httpx.get(f"{url}/inspector?request=x", timeout=5).status_code == 200
        children = descendants(proc.pid)
        assert len(children) >= 5  # demo (router + 2 workers), collect, streamlit
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        wait_until(lambda: not any(alive(c) for c in children), 20, 0.3,
                   what="every child gone")
        assert not ready.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_demo_router_leaves_the_dashboard_up_and_exit_cleans_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from mmlens.store.open import open_store
    from tests.pages.apptest_util import messages, open_page

    ready, db = tmp_path / "ready.json", tmp_path / "m.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmlens", "dashboard", "--demo", "--no-warmup", "--port",
         str(free_port()), "--port-base", str(free_port_base(50)), "--db", str(db),
         "--ready-file", str(ready), "--interval", "1"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        info = wait_until(lambda: ready_info(ready, proc), 90, 0.3, what="dashboard ready")
        scratch = Path(info["config"]).parent
        demo = json.loads((scratch / "demo-ready.json").read_text())
        assert [r["mm_processing"] for r in demo["routers"]] == ["router", "worker"]
        os.kill(demo["routers"][0]["pid"], signal.SIGKILL)

        def router_down() -> bool:
            store = open_store(str(db))
            try:
                states = {s["router"]: s for s in store.meta("router_state") or []}
            finally:
                store.close()
            return "demo" in states and not states["demo"].get("workers")

        wait_until(router_down, 30, 0.5, what="the collector sees the router down")
        assert proc.poll() is None  # the dashboard serves on
        assert httpx.get(f"{info['dashboard']}/_stcore/health", timeout=5).status_code == 200
        monkeypatch.setenv("MMLENS_DB", str(db))
        at = open_page("overview")
        assert any("Router demo is down" in e for e in messages(at)["error"])
        assert scratch.is_dir()
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert not scratch.exists()  # config, demo logs and ready lines removed at exit
        assert db.exists()  # the store the user named stays
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_dashboard_on_a_postgresql_store(tmp_path: Path, postgres) -> None:
    """`mmlens dashboard --demo --db postgresql://…`: the collector writes the server store and
    the dashboard reads it (the pages themselves on PostgreSQL: test_pages_recorded)."""
    from mmlens.store.open import NoStoreYet, open_store
    from tests.conftest import new_database

    db = new_database(postgres)
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmlens", "dashboard", "--demo", "--no-warmup", "--port",
         str(free_port()), "--port-base", str(free_port_base(50)), "--db", db,
         "--interval", "0.5", "--ready-file", str(ready)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        info = wait_until(lambda: ready_info(ready, proc), 90, 0.3, what="dashboard ready")
        assert info["db"] == db

        def scraped() -> bool:
            store = open_store(db, readonly=True)
            try:
                return store.latest_sample_ts() is not None and bool(store.meta("targets"))
            finally:
                store.close()

        wait_until(scraped, 60, 0.5, what="collector wrote samples", ignore=(NoStoreYet,))
        url = str(info["dashboard"])
        wait_until(lambda: httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200,
                   30, 0.3, what="Streamlit healthy", ignore=(httpx.HTTPError,))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_a_log_dir_in_demo_args_is_where_the_collector_reads(tmp_path) -> None:
    import argparse

    from mmlens.cli.dashboard import demo_command
    from mmlens.config import load_config
    from mmlens.targets_toml import config_toml_from_ready

    logs = tmp_path / "elsewhere"
    args = argparse.Namespace(demo_args=f"--log-dir {logs} --ready-file x.json", port_base=0,
                              one_router=True)
    cmd = demo_command(args, "python", tmp_path / "scratch")
    assert cmd.count("--log-dir") == 1 and cmd[cmd.index("--log-dir") + 1] == str(logs)
    assert cmd[-2:] == ["--ready-file", str(tmp_path / "scratch" / "demo-ready.json")]
    ready = {"router_kind": "smg", "routers": [{"name": "demo", "url": "http://127.0.0.1:1",
                                                "log": str(logs / "smg-demo.log")}]}
    config = tmp_path / "scratch" / "mmlens.toml"
    config.parent.mkdir()
    config.write_text(config_toml_from_ready(ready, 2.0, [str(logs)]))
    (router,) = load_config(config).routers  # was: outside the config's folder, exit 2
    assert router.log_file == str(logs / "smg-demo.log")
