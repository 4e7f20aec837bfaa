"""Process plumbing shared by the demo clusters: loopback port checks, child processes in
their own process groups (stopped by PID, sent a signal when the demo dies), the ready file."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

HOST = "127.0.0.1"
PR_SET_PDEATHSIG = 1
REPO_ROOT = Path(__file__).resolve().parent.parent


class ClusterError(RuntimeError):
    pass


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def require_free(ports: Iterable[int]) -> None:
    busy = [p for p in ports if not port_free(p)]
    if busy:
        raise ClusterError(f"ports already in use: {busy} (choose another --port-base)")


def _set_parent_death_signal(sig: int) -> None:
    """In the child: get `sig` if the process that started us dies, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, sig)


def with_repo_on_path(env: dict[str, str]) -> dict[str, str]:
    """`env`, with this checkout first on PYTHONPATH so child processes import `demo` from it."""
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    return env


def smg_command() -> list[str]:
    script = Path(sys.executable).with_name("smg")
    return [str(script)] if script.exists() else [sys.executable, "-m", "smg"]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]

    def tail(self, lines: int = 15, width: int | None = None) -> str:
        """The log's last `lines` lines (each cut to `width` characters when given)."""
        with contextlib.suppress(OSError):
            last = self.log_path.read_text(errors="replace").splitlines()[-lines:]
            return "\n".join(line[:width] for line in last)
        return ""

    def check_alive(self, width: int | None = None) -> None:
        if self.popen.poll() is not None:
            raise ClusterError(f"{self.name} exited ({self.popen.returncode}); see "
                               f"{self.log_path}:\n{self.tail(width=width)}")

    def terminate(self) -> None:
        """SIGTERM the process group, if the process still runs."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)

    def reap(self, timeout: float) -> None:
        """Wait up to `timeout` s, SIGKILL the group if the process outlives it, then close
        the log."""
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=5)
        # Children left in the group (none expected) go too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.log.close()


def spawn(log_dir: Path, name: str, cmd: list[str], env: dict[str, str] | None = None, *,
          cwd: Path | None = None, death_signal: int = signal.SIGTERM) -> Proc:
    """Start `cmd` in its own process group, its output to `log_dir/<name>.log`; it gets
    `death_signal` when the process that started it dies."""
    log_path = log_dir / f"{name}.log"
    log = log_path.open("wb")
    popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env, start_new_session=True, cwd=cwd,
                             preexec_fn=functools.partial(_set_parent_death_signal, death_signal))
    return Proc(name, popen, log_path, log)



def write_ready(path: Path, info: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(info, indent=1))
    tmp.replace(path)
