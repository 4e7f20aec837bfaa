"""`mmlens dashboard --demo` starts demo, collectors and Streamlit, serves deep links, and on
Ctrl-C (SIGINT to its process group, as a terminal sends it) leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.live_support import REPO, free_port, free_port_base

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
        deadline = time.monotonic() + 90
        while not (ready.exists() and ready.stat().st_size):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.3)
        url = json.loads(ready.read_text())["dashboard"]
        for _ in range(100):
            try:
                if httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        # A deep link is served by the app (the page itself renders client-side).
        assert httpx.get(f"{url}/inspector?request=x", timeout=5).status_code == 200
        children = descendants(proc.pid)
        assert len(children) >= 5  # demo (router + 2 workers), collect, streamlit
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        deadline = time.monotonic() + 20
        while any(alive(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert not [c for c in children if alive(c)]
        assert not ready.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
