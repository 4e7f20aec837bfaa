"""`mmlens demo` as users and `mmlens dashboard --demo` run it: ready file, one request, Ctrl-C,
and nothing left behind (no process of its process groups, no listening port)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.demo.support import image_messages, png_data_url
from tests.live_support import REPO, free_port_base, ready_info, wait_until

pytestmark = pytest.mark.live


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_demo_cli_ready_request_and_clean_ctrl_c(tmp_path: Path) -> None:
    base = free_port_base(40)
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmlens", "demo", "--port-base", str(base), "--ready-file",
         str(ready), "--log-dir", str(tmp_path / "logs")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        info = wait_until(lambda: ready_info(ready, proc), 20, what="demo ready")
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == info  # the same line on stdout
        assert info["router"] == f"http://127.0.0.1:{base}"
        assert len(info["workers"]) == 2
        r = httpx.post(info["router"] + "/v1/chat/completions", timeout=30, json={
            "model": info["models"][0]["id"], "max_tokens": 3,
            "messages": image_messages(png_data_url(64, 64, (50, 100, 150)))})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 81
        pids = [info["router_pid"], *(w["pid"] for w in info["workers"])]
        ports = [base, base + 1] + [base + 10 + 10 * i + k for i in range(2) for k in range(4)]
        assert all(listening(p) for p in ports)
        t_stop = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=25) == 0
        assert time.monotonic() - t_stop < 15  # SMG's drain (7-9 s) included
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not ready.exists()
    assert not any(alive(pid) for pid in pids)
    assert not any(listening(p) for p in ports)


def test_a_killed_demo_takes_its_processes_with_it(tmp_path: Path) -> None:
    base = free_port_base(40)
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmlens", "demo", "--port-base", str(base), "--workers", "1",
         "--connection", "http", "--ready-file", str(ready), "--log-dir", str(tmp_path / "logs")],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        info = wait_until(lambda: ready_info(ready, proc), 20, what="demo ready")
        pids = [info["router_pid"], info["workers"][0]["pid"]]
        proc.kill()  # SIGKILL: no cleanup code of the demo runs
        proc.wait()
        # SMG still drains after its SIGTERM
        wait_until(lambda: not any(alive(p) for p in pids), 15, 0.2, what="its processes gone")
        assert not listening(base) and not listening(base + 11)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
