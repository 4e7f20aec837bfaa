"""`mmlens dashboard`: serve the Streamlit app on 127.0.0.1, optionally on the embedded demo.

With ``--demo``: starts the demo cluster (on SMG: a router-mode and a worker-mode router over
the same workers), writes an ``mmlens.toml`` for its targets, starts ``mmlens collect`` into a
store the pages read (``MMLENS_DB``), sends a short warm-up workload, then serves the app.
Every child is stopped by its PID on exit, and the temporary folder is removed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import cast

import httpx

from mmlens.store.open import NoStoreYet, StoreError, is_postgres_url, open_store

# app.py behind the page-HTML middleware (mmlens.ui.root_base)
APP = Path(__file__).resolve().parents[2] / "serve.py"

# Streamlit treats an app with a `pages/` folder as a legacy multipage app until some session
# has run `st.navigation`, so a first visit to a deep link (/inspector?request=…) would run
# that page alone, without app.py. Declaring the app navigation-based up front avoids that.
LAUNCH_STREAMLIT = (
    "import sys\n"
    "from streamlit.runtime.pages_manager import PagesManager\n"
    "PagesManager.uses_pages_directory = False\n"
    "from streamlit.web.cli import main\n"
    "sys.argv[0] = 'streamlit'\n"
    "sys.exit(main())\n"
)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmlens dashboard", description=__doc__)
    p.add_argument("--port", type=int, default=8501, help="dashboard port (default 8501)")
    p.add_argument("--demo", action="store_true", help="start the embedded demo cluster first")
    p.add_argument("--config", help="mmlens.toml with the targets to observe")
    p.add_argument("--db", help="store: a SQLite file path (default: a file in a temporary "
                   "directory) or a postgresql://… URL")
    p.add_argument("--demo-args", default="", help="extra arguments for `mmlens demo`")
    p.add_argument("--one-router", action="store_true",
                   help="SMG demo: no second, worker-mode router")
    p.add_argument("--port-base", type=int, help="`mmlens demo --port-base`")
    p.add_argument("--no-collect", action="store_true", help="do not start `mmlens collect`")
    p.add_argument("--no-warmup", action="store_true", help="no warm-up workload on the demo")
    p.add_argument("--interval", type=float, default=2.0, help="collector interval (s)")
    p.add_argument("--ready-timeout", type=float, default=60.0)
    p.add_argument("--ready-file", help="also write {dashboard, db, router} here when serving")
    return p.parse_args(list(argv))


def wait_ready(path: Path, proc: subprocess.Popen[bytes], timeout: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"demo exited with code {proc.returncode} before it was ready")
        if path.exists() and path.stat().st_size:
            try:
                # The demo writes its ready file as one JSON object.
                return cast(dict[str, object], json.loads(path.read_text()))
            except ValueError:
                pass  # caught mid-write
        time.sleep(0.2)
    raise RuntimeError(f"demo not ready within {timeout:.0f} s")


def wait_serving(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Until Streamlit answers its health check: "ready" means the URL serves."""
    url = f"http://127.0.0.1:{port}/_stcore/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {proc.returncode} before serving")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"streamlit not serving on port {port} within {timeout:.0f} s")


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


class Children:
    """Child processes, stopped in reverse start order by PID (SIGINT, then SIGKILL)."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None,
              ) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
        self.procs.append((name, proc))
        return proc

    def stop_all(self, grace_s: float = 30.0) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + grace_s
        for _, proc in reversed(self.procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _wait_for_store(db: str, timeout: float) -> bool:
    """Until the collector has created the store (a file, or the tables on a server)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            open_store(db, readonly=True).close()
            return True
        except NoStoreYet:
            time.sleep(0.2)
        except StoreError:
            return False
    return False


def supervise(children: Children, ui: subprocess.Popen[bytes]) -> int:
    """Serve until Streamlit exits; reap the finished warm-up. The collectors dying stops the
    dashboard (the pages would silently go stale); the demo cluster dying does not: the
    collectors keep reporting, and the pages show its router and workers down."""
    reported: set[str] = set()
    while ui.poll() is None:
        for name, proc in children.procs:
            code = proc.poll()
            if code is None or name in reported:
                continue
            reported.add(name)
            if name == "collect":
                print(f"mmlens dashboard: {name} exited with code {code}; stopping",
                      file=sys.stderr, flush=True)
                return 1
            if name == "demo":
                print(f"mmlens dashboard: the demo cluster exited with code {code}; the pages "
                      "show its targets down", file=sys.stderr, flush=True)
        time.sleep(0.5)
    return ui.returncode


def user_log_dir(extra: list[str]) -> str | None:
    """A ``--log-dir`` given in ``--demo-args`` (the demo's logs go there instead)."""
    for i, arg in enumerate(extra):
        if arg == "--log-dir" and i + 1 < len(extra):
            return str(Path(extra[i + 1]).resolve())
        if arg.startswith("--log-dir="):
            return str(Path(arg.split("=", 1)[1]).resolve())
    return None


def demo_command(args: argparse.Namespace, py: str, scratch: Path) -> list[str]:
    """`mmlens demo` for --demo: on SMG, with a second router in worker mode."""
    extra = args.demo_args.split()
    cmd = [py, "-m", "mmlens", "demo"]
    if user_log_dir(extra) is None:
        cmd += ["--log-dir", str(scratch / "demo-logs")]
    if args.port_base:
        cmd += ["--port-base", str(args.port_base)]
    dynamo = any(a in ("dynamo", "--router=dynamo") for a in extra)
    plain = {"--connection", "--engine", "--mm-processing", "--worker-processing"}
    if not (args.one_router or dynamo or plain & {a.split("=", 1)[0] for a in extra}):
        cmd.append("--worker-mode-router")
    # The ready file last: one in --demo-args would leave the dashboard waiting for ever.
    return [*cmd, *extra, "--ready-file", str(scratch / "demo-ready.json")]


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    env = dict(os.environ)
    scratch = Path(tempfile.mkdtemp(prefix="mmlens-"))
    if args.db and is_postgres_url(args.db):
        db = args.db
    else:
        db = str(Path(args.db).resolve() if args.db else scratch / "mmlens.db")
    env["MMLENS_DB"] = db
    config = Path(args.config).resolve() if args.config else None
    py = sys.executable
    children = Children()
    # Explicit for SIGINT too: a shell that starts us in the background sets it to ignored.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        # Streamlit starts first and answers while the demo cluster starts behind it (~10 s):
        # the pages say there is no data yet until the collectors write the store. The paths
        # the demo's config and ready line will have are known up front.
        if args.demo:
            env["MMLENS_DEMO_READY"] = str(scratch / "demo-ready.jsonl")
        generated = args.demo and config is None
        if generated:
            config = scratch / "mmlens.toml"
        if config is not None:
            env["MMLENS_CONFIG"] = str(config)
        cmd = [
            py, "-c", LAUNCH_STREAMLIT, "run", str(APP),
            "--server.address", "127.0.0.1",
            "--server.port", str(args.port),
            "--server.headless", "true",
            "--browser.gatherUsageStats", "false",
            # No watching the source tree for edits: a served dashboard is not being
            # developed, and the watcher's start-up scan and polling cost seconds of CPU.
            "--server.fileWatcherType", "none",
            # No page writes by a bare expression: "magic" rewrites each page's syntax tree on
            # its first run, 25 of the Inspector's 140 ms cold script (bench store, quiet).
            "--runner.magicEnabled", "false",
            # No full garbage collection after every script run: it holds the GIL (a fleet
            # store's heap: 240-490 ms at load 3), so each click's last message waited for it.
            # Python's own collector still runs as allocations go.
            "--runner.postScriptGC", "false",
        ]
        print(f"dashboard: http://127.0.0.1:{args.port}", flush=True)
        ui = children.start("streamlit", cmd, env)
        if args.demo:
            from mmlens.targets_toml import config_toml_from_ready

            demo = children.start("demo", demo_command(args, py, scratch))
            info = wait_ready(scratch / "demo-ready.json", demo, args.ready_timeout)
            Path(env["MMLENS_DEMO_READY"]).write_text(json.dumps(info) + "\n")
            if generated and config is not None:
                own_logs = user_log_dir(args.demo_args.split())  # the collector may read it
                config.write_text(config_toml_from_ready(info, args.interval,
                                                         [own_logs] if own_logs else []))
            for r in info.get("routers") or [{"name": "demo", "url": info.get("router")}]:
                print(f"demo ready: router {r['name']} {r['url']}"
                      + (f" ({r['mm_processing']} mode)" if r.get("mm_processing") else ""),
                      flush=True)
        if config is not None:
            if not args.no_collect:
                children.start("collect", [py, "-m", "mmlens", "collect", "--config",
                                           str(config), "--db", str(db),
                                           "--interval", str(args.interval)], env)
                _wait_for_store(db, 20.0)
            if args.demo and not args.no_warmup:
                children.start("warmup", [py, "-m", "mmlens.collectors.warmup", "--ready-file",
                                          env["MMLENS_DEMO_READY"], "--db", str(db)], env)
        wait_serving(args.port, ui, args.ready_timeout)
        if args.ready_file:
            Path(args.ready_file).write_text(json.dumps({
                "event": "ready", "dashboard": f"http://127.0.0.1:{args.port}",
                "db": str(db), "config": str(config) if config else None}) + "\n")
        return supervise(children, ui)
    except KeyboardInterrupt:
        return 0
    except RuntimeError as exc:
        print(f"mmlens dashboard: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        children.stop_all()
        if args.ready_file:
            with contextlib.suppress(OSError):
                Path(args.ready_file).unlink()
        # Config, demo logs, ready lines and the default (temporary) store; a --db is elsewhere.
        shutil.rmtree(scratch, ignore_errors=True)
