"""Helpers shared by the tests that start processes on 127.0.0.1 (demo, Dynamo, collectors,
pages, scenarios): free ports, a cluster started with retries, `mmlens demo` as a separate
process, stopping a process a test started, and waiting for an asynchronous effect."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports the kernel hands to outgoing connections (a PostgreSQL client, an HTTP pool) can be
# taken between a probe and the bind that follows, so tests pick ports below that range, and
# never the same one twice in a process (several are probed before any is bound; clusters
# started from several threads at once pick under one lock).
_EPHEMERAL_LOW = _ephemeral_low()
_PICK_LOW = 20000 if _EPHEMERAL_LOW > 21000 else 10000
_handed: set[int] = set()
_picking = threading.Lock()
_rng = random.Random(os.getpid() ^ time.monotonic_ns())


def free_port() -> int:
    """A free loopback port outside the ephemeral range, not handed out before in this process."""
    with _picking:
        return _free_port()


def _free_port() -> int:
    for _ in range(500):
        port = _rng.randrange(_PICK_LOW, _EPHEMERAL_LOW)
        if port not in _handed and port_free(port):
            _handed.add(port)
            return port
    raise RuntimeError("no free port found")


def loopback_endpoints(n: int) -> list[str]:
    """n free loopback TCP endpoints (ZMQ's spelling)."""
    return [f"tcp://{LOOPBACK}:{free_port()}" for _ in range(n)]


def free_port_base(span: int = 60, ports: Callable[[int], Iterable[int]] | None = None) -> int:
    """A port base, below the ephemeral range, whose ports are all free and not handed out
    before in this process: the `span` ports from it, or `ports(base)`."""
    with _picking:
        return _free_port_base(span, ports)


def _free_port_base(span: int, ports: Callable[[int], Iterable[int]] | None) -> int:
    for _ in range(200):
        base = _rng.randrange(_PICK_LOW, _EPHEMERAL_LOW - span, 10)
        wanted = list(ports(base) if ports else range(base, base + span))
        if not _handed.intersection(wanted) and all(port_free(p) for p in wanted):
            _handed.update(wanted)
            return base
    raise RuntimeError("no free port range found")


class _Startable(Protocol):
    def start(self) -> Any: ...

    def stop(self) -> None: ...


_C = TypeVar("_C", bound=_Startable)
_T = TypeVar("_T")


def wait_until(predicate: Callable[[], _T], timeout: float = 10.0, interval: float = 0.1, *,
               what: str = "", ignore: tuple[type[Exception], ...] = ()) -> _T:
    """Poll `predicate` every `interval` s until it returns something truthy, and return
    that; fail the test after `timeout` s, naming `what`. An exception of an `ignore` type
    counts as "not yet"; any other ends the wait at once (so a predicate can give up early,
    e.g. when the process it waits for has exited)."""
    deadline = time.monotonic() + timeout
    value: _T | None
    while True:
        try:
            value = predicate()
        except ignore:
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            name = what or getattr(predicate, "__name__", "condition")
            raise AssertionError(f"not within {timeout:g} s: {name} (last: {value!r})")
        time.sleep(interval)


async def wait_until_async(predicate: Callable[[], _T], timeout: float = 10.0,
                           interval: float = 0.001, *, what: str = "") -> _T:
    """`wait_until` inside an event loop: yields to the loop between polls."""
    import asyncio

    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:g} s: {what or 'condition'}")
        await asyncio.sleep(interval)
    return value


def zmq_connect(sock: Any, endpoint: str, timeout: float = 10.0) -> None:
    """Connect a ZMQ socket and return once the peer has completed the handshake (a SUB
    socket sends its subscriptions right after it, before anything the test triggers)."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        sock.connect(endpoint)
        assert monitor.poll(int(timeout * 1000)), f"no ZMQ handshake with {endpoint}"
        recv_monitor_message(monitor)
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)


@contextlib.contextmanager
def started(make: Callable[[], _C], attempts: int = 3) -> Iterator[_C]:
    """A cluster from `make()`, started; a fresh one (new ports) when a start fails, up to
    `attempts` in all. Stopped on exit."""
    for attempt in range(attempts):
        cluster = make()
        try:
            cluster.start()
        except Exception:
            cluster.stop()
            if attempt == attempts - 1:
                raise
            continue
        try:
            yield cluster
        finally:
            cluster.stop()
        return


def stop_process(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 30.0,
                 *, group: bool = False) -> None:
    """Send `sig` to a process a test started (with `group`, to its whole process group, even
    once the leader has exited), give it `timeout` s, then SIGKILL."""
    if group:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
    elif proc.poll() is None:
        proc.send_signal(sig)
    else:
        return
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.wait()


def ready_info(ready: Path, proc: subprocess.Popen[Any] | None = None) -> dict[str, Any] | None:
    """The JSON a process wrote to its ready file, once the file is complete (None before);
    fails the test if `proc` has exited first."""
    if proc is not None and proc.poll() is not None:
        pytest.fail(proc.stderr.read().decode() if proc.stderr else "exited before ready")
    try:
        return json.loads(ready.read_text()) or None
    except (OSError, ValueError):  # not there yet, or still being written
        return None


@contextlib.contextmanager
def demo_process(args: list[str], ready: Path, what: str = "demo") -> Iterator[dict[str, Any]]:
    """`mmlens demo ARGS --ready-file READY` as users run it: its ready info once the file is
    written (fails the test if it exits first or takes over 60 s); Ctrl-C (SIGINT) at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmlens", "demo", *args, "--ready-file", str(ready)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield wait_until(lambda: ready_info(ready, proc), 60, 0.2, what=f"{what} ready")
    finally:
        stop_process(proc, signal.SIGINT, 30)


@dataclass
class Collecting:
    """A collector on a running demo (from its ready info) and a traced sender into its
    store, as `mmlens collect` and the Lab run them."""

    runner: Any
    store: Any
    tracer: Any
    router: str
    model: str

    def send(self, image: bytes, text: str, kind: str, max_tokens: int = 4) -> Any:
        from mmlens.collectors.traces import ImagePart

        return self.tracer.send(self.router, self.model, text, [ImagePart(image)],
                                router_kind=kind, max_tokens=max_tokens)

    def stored_blocks(self) -> int:
        self.runner.tick()
        return sum(v.get("stored_blocks", 0) for v in self.store.kv_event_counts().values())


@contextlib.contextmanager
def collecting(info: dict[str, Any], db: Path) -> Iterator[Collecting]:
    import httpx
    from mmlens.collectors.runner import CollectorRunner
    from mmlens.collectors.trace_sink import TraceSink
    from mmlens.collectors.traces import TraceClient

    from mmlens.config import Config, apply_ready
    from mmlens.store.open import open_store

    cfg = Config()
    apply_ready(cfg, info)
    store = open_store(str(db))
    runner = CollectorRunner(cfg, store)
    client = httpx.Client(timeout=120)
    model = info["models"][0]
    tracer = TraceClient(client, sink=TraceSink(store.add_traces, layout_model=model["path"]))
    try:
        runner.setup()
        runner.start_kv()
        yield Collecting(runner, store, tracer, info["router"], model["id"])
    finally:
        runner.close()
        client.close()
        store.close()
