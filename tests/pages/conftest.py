"""A running `mmlens dashboard --demo` (real SMG router, simulated workers, collectors, warm-up
workload, Streamlit) on free loopback ports, shared by the live page and browser tests."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from mmlens.store.reader import StoreReader
from tests.live_support import REPO, free_port, free_port_base, stop_process

WARMUP_TRACES = 12


@dataclass
class LiveDashboard:
    url: str
    db: Path
    config: Path | None
    pid: int


def _wait_warm(db: Path, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dashboard exited with {proc.returncode}")
        if db.exists():
            reader = StoreReader(db)
            try:
                if (reader.trace_count() >= WARMUP_TRACES and reader.latest_kv_ts()
                        and reader.latest_sample_ts()):
                    return
            finally:
                reader.close()
        time.sleep(0.5)
    raise RuntimeError("warm-up traces did not reach the store in time")


@pytest.fixture(scope="session")
def live_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveDashboard]:
    work = tmp_path_factory.mktemp("dashboard")
    ready = work / "ready.json"
    db = work / "mmlens.db"
    port = free_port()
    cmd = [sys.executable, "-m", "mmlens", "dashboard", "--demo", "--port", str(port),
           "--port-base", str(free_port_base(50)), "--db", str(db), "--ready-file", str(ready)]
    log = (work / "dashboard.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not (ready.exists() and ready.stat().st_size):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("dashboard not ready:\n" + (work / "dashboard.log")
                                   .read_text()[-3000:])
            time.sleep(0.3)
        info = json.loads(ready.read_text())
        _wait_warm(db, proc, 90)
        url = info["dashboard"]
        for _ in range(100):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.3)
        yield LiveDashboard(url, db, Path(info["config"]) if info.get("config") else None,
                            proc.pid)
    finally:
        stop_process(proc, signal.SIGTERM, 45)
        log.close()
