"""`mmlens dashboard`: serve the Streamlit app on 127.0.0.1, optionally on the embedded demo."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app.py"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmlens dashboard", description=__doc__)
    p.add_argument("--port", type=int, default=8501, help="dashboard port (default 8501)")
    p.add_argument("--demo", action="store_true", help="start the embedded demo cluster first")
    p.add_argument("--config", help="mmlens.toml with the targets to observe")
    p.add_argument("--db", help="store path (SQLite)")
    p.add_argument("--demo-args", default="", help="extra arguments for `mmlens demo`")
    p.add_argument("--ready-timeout", type=float, default=60.0)
    return p.parse_args(list(argv))


def wait_ready(path: Path, proc: subprocess.Popen[bytes], timeout: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"demo exited with code {proc.returncode} before it was ready")
        if path.exists() and path.stat().st_size:
            return json.loads(path.read_text())
        time.sleep(0.2)
    raise RuntimeError(f"demo not ready within {timeout:.0f} s")


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    env = dict(os.environ)
    demo: subprocess.Popen[bytes] | None = None
    scratch = Path(tempfile.mkdtemp(prefix="mmlens-"))
    if args.config:
        env["MMLENS_CONFIG"] = str(Path(args.config).resolve())
    if args.db:
        env["MMLENS_DB"] = str(Path(args.db).resolve())
    try:
        if args.demo:
            ready = scratch / "demo-ready.json"
            cmd = [sys.executable, "-m", "mmlens", "demo", "--ready-file", str(ready)]
            cmd += args.demo_args.split()
            demo = subprocess.Popen(cmd)
            info = wait_ready(ready, demo, args.ready_timeout)
            env["MMLENS_DEMO_READY"] = str(ready)
            print(f"demo ready: router {info.get('router')}", flush=True)
        cmd = [
            sys.executable, "-m", "streamlit", "run", str(APP),
            "--server.address", "127.0.0.1",
            "--server.port", str(args.port),
            "--server.headless", "true",
            "--browser.gatherUsageStats", "false",
        ]
        print(f"dashboard: http://127.0.0.1:{args.port}", flush=True)
        ui = subprocess.Popen(cmd, env=env)
        try:
            return ui.wait()
        except KeyboardInterrupt:
            ui.send_signal(signal.SIGINT)
            return ui.wait()
    finally:
        if demo is not None and demo.poll() is None:
            demo.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                demo.wait(timeout=30)
            if demo.poll() is None:
                demo.kill()
