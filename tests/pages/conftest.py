"""A running `mmlens dashboard --demo` (real SMG router, simulated workers, collectors, warm-up
workload, Streamlit) on free loopback ports, shared by the live page and browser tests."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from mmlens.store.reader import StoreReader
from tests.conftest import BACKENDS, new_database
from tests.live_support import REPO, free_port, free_port_base, ready_info, stop_process, wait_until
from tests.pages.apptest_util import strict_page_guard  # noqa: F401  (autouse here)
from tests.pages.recorded_store import Recorded, fill

WARMUP_TRACES = 12


@dataclass
class LiveDashboard:
    url: str
    db: Path
    config: Path | None
    pid: int


def _warm(db: Path, log: Path, proc: subprocess.Popen[bytes]) -> bool:
    """The warm-up workload has finished (its summary line is in the dashboard's log; the
    store also holds requests mmlens observed but did not send, so a row count says less)
    and KV events and samples are in the store."""
    if proc.poll() is not None:
        raise RuntimeError(f"dashboard exited with {proc.returncode}")
    if not db.exists() or "warm-up: " not in log.read_text(errors="replace"):
        return False
    reader = StoreReader(db)
    try:
        return bool(reader.trace_count() >= WARMUP_TRACES and reader.latest_kv_ts()
                    and reader.latest_sample_ts())
    finally:
        reader.close()


@pytest.fixture(scope="session")
def live_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveDashboard]:
    work = tmp_path_factory.mktemp("dashboard")
    ready = work / "ready.json"
    db = work / "mmlens.db"
    port = free_port()
    cmd = [sys.executable, "-m", "mmlens", "dashboard", "--demo", "--port", str(port),
           "--port-base", str(free_port_base(50)), "--db", str(db), "--ready-file", str(ready),
           # the demo's own 20 s is too short for SMG's start on a loaded 2-core machine
           "--ready-timeout", "120", "--demo-args", "--ready-timeout 90"]
    log = (work / "dashboard.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        try:
            info = wait_until(lambda: ready_info(ready, proc), 150, 0.3,
                              what="dashboard ready")
        except (AssertionError, pytest.fail.Exception) as exc:  # timed out, or it exited
            raise RuntimeError("dashboard not ready:\n" + (work / "dashboard.log")
                               .read_text()[-3000:]) from exc
        wait_until(lambda: _warm(db, work / "dashboard.log", proc), 90, 0.5,
                   what="warm-up done, its data in the store")
        url = info["dashboard"]
        wait_until(lambda: httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200,
                   30, 0.3, what="Streamlit healthy", ignore=(httpx.HTTPError,))
        yield LiveDashboard(url, db, Path(info["config"]) if info.get("config") else None,
                            proc.pid)
    finally:
        stop_process(proc, signal.SIGTERM, 45)
        log.close()


@pytest.fixture(scope="module", params=BACKENDS)
def recorded(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """A store of constructed records (tests/pages/recorded_store.py), one per test module
    and backend: every page reads SQLite and PostgreSQL alike."""
    if request.param == "sqlite":
        return fill(str(tmp_path_factory.mktemp("store") / "mmlens.db"), time.time())
    return fill(new_database(request.getfixturevalue("postgres")), time.time())


@pytest.fixture
def db(recorded: Recorded, monkeypatch: pytest.MonkeyPatch) -> Recorded:
    """The pages read the recorded store (and no targets file)."""
    monkeypatch.setenv("MMLENS_DB", str(recorded.path))
    monkeypatch.delenv("MMLENS_CONFIG", raising=False)
    return recorded


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser_page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A page of Debian's headless Chromium, driven by Playwright (skips without either)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("no chromium (scripts/test installs it with apt when run as root)")
    profile = tempfile.mkdtemp(dir=tmp_path_factory.mktemp("chromium"))
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=FLAGS, headless=True,
            viewport={"width": 1400, "height": 2000})
        try:
            yield ctx.new_page()
        finally:
            ctx.close()
