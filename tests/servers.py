"""Real servers for tests and benchmarks, each on 127.0.0.1, a free port and a temporary
directory, stopped by PID: PostgreSQL (Debian ``postgresql-15``: initdb + pg_ctl, as the
``postgres`` user when run as root, since PostgreSQL refuses to run as root) and
VictoriaMetrics (Debian ``victoria-metrics``) scraping a given Prometheus scrape config."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.live_support import LOOPBACK, free_port, stop_process, wait_until


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL server's bin directory (Debian keeps it off PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


@dataclass(frozen=True)
class Postgres:
    port: int
    pid: int
    user: str
    datadir: Path

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.user}@{LOOPBACK}:{self.port}/{dbname}"


def _as_server_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def stop_pid(pid: int, sig: int = signal.SIGINT, timeout: float = 30.0) -> None:
    """Signal a server that is not our child (pg_ctl daemonizes it; SIGINT is PostgreSQL's
    fast shutdown) and wait for it to go; SIGKILL after ``timeout``."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    try:
        wait_until(lambda: _pid_gone(pid), timeout, 0.05, what=f"server {pid} gone")
    except AssertionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: _pid_gone(pid), 5, 0.05, what=f"server {pid} gone after SIGKILL")


@contextlib.contextmanager
def postgres_server(user: str = "mmlens", durable: bool = False) -> Iterator[Postgres]:
    """A fresh PostgreSQL cluster (trust auth for ``user`` on loopback, socket in the data
    directory's parent), stopped and removed on exit. Tests run it without fsync; ``durable``
    keeps PostgreSQL's default durability (what a benchmark should measure)."""
    bindir = postgres_bin()
    if bindir is None:
        raise FileNotFoundError("PostgreSQL server not installed (Debian: postgresql-15)")
    root = Path(tempfile.mkdtemp(prefix="mmlens-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    pid = None
    try:
        subprocess.run(_as_server_user([
            str(bindir / "initdb"), "-D", str(data), "-U", user, "--auth=trust",
            "-E", "UTF8", "--no-sync"]), check=True, capture_output=True)
        port = free_port()
        opts = f"-p {port} -c listen_addresses={LOOPBACK} -k {root}"
        if not durable:
            opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        subprocess.run(_as_server_user([
            str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "log"),
            "-w", "-t", "60", "start"]), check=True, capture_output=True)
        pid = int((data / "postmaster.pid").read_text().split()[0])
        yield Postgres(port, pid, user, data)
    finally:
        if pid is not None:
            stop_pid(pid)
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class TSDB:
    url: str
    pid: int


def wait_for(predicate: Callable[[], bool], timeout: float, what: str,
             alive: Callable[[], bool] = lambda: True) -> None:
    """`wait_until` for a server: gives up at once when `alive` says it has exited."""

    def ready() -> bool:
        if predicate():
            return True
        if not alive():
            raise RuntimeError(f"{what}: the server exited")
        return False

    wait_until(ready, timeout, 0.3, what=what)


@contextlib.contextmanager
def victoria_metrics_server(scrape_config: str) -> Iterator[TSDB]:
    """VictoriaMetrics single-node scraping by ``scrape_config`` (Prometheus YAML). Query
    latency offset 0 s so it answers with the newest scrape, as Prometheus does."""
    binary = shutil.which("victoria-metrics")
    if binary is None:
        raise FileNotFoundError("victoria-metrics not installed (Debian: victoria-metrics)")
    root = Path(tempfile.mkdtemp(prefix="mmlens-vm-"))
    (root / "scrape.yml").write_text(scrape_config)
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"-storageDataPath={root / 'data'}", f"-httpListenAddr={LOOPBACK}:{port}",
         f"-promscrape.config={root / 'scrape.yml'}", "-search.latencyOffset=0s",
         "-search.disableCache"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://{LOOPBACK}:{port}"

        def healthy() -> bool:
            try:
                return httpx.get(url + "/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 30, "victoria-metrics health", lambda: proc.poll() is None)
        yield TSDB(url, proc.pid)
    finally:
        stop_process(proc, signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


def _query_ok(url: str, query: str, check: Callable[[list[dict[str, object]]], bool]) -> bool:
    try:
        r = httpx.get(url + "/api/v1/query", params={"query": query}, timeout=1)
        return check(r.json()["data"]["result"])
    except (httpx.HTTPError, KeyError, ValueError):
        return False


@contextlib.contextmanager
def prometheus_server(scrape_config: str, args: Sequence[str] = ()) -> Iterator[TSDB]:
    """Prometheus (Debian ``prometheus``) scraping by ``scrape_config``, with extra command-line
    ``args`` (e.g. ``--enable-feature=exemplar-storage``); same shape as
    :func:`victoria_metrics_server`."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise FileNotFoundError("prometheus not installed (Debian: prometheus)")
    root = Path(tempfile.mkdtemp(prefix="mmlens-prom-"))
    (root / "prometheus.yml").write_text(scrape_config)
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"--config.file={root / 'prometheus.yml'}",
         f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address={LOOPBACK}:{port}",
         *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://{LOOPBACK}:{port}"
        wait_for(lambda: _query_ok(url, "vector(1)", bool), 30, "prometheus answers",
                 lambda: proc.poll() is None)
        yield TSDB(url, proc.pid)
    finally:
        stop_process(proc, signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


def wait_scraped(url: str, n_targets: int, timeout: float = 30.0) -> None:
    """Until ``sum(up)`` says every target was scraped successfully."""
    wait_for(lambda: _query_ok(url, "sum(up)", lambda res: bool(res) and float(
        res[0]["value"][1]) == n_targets), timeout, "TSDB did not scrape all targets")
