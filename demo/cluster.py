"""Start and stop the demo cluster: N simulated workers, then the real SMG router.

Every process gets its own process group and is stopped by PID. Everything binds 127.0.0.1.
Port layout from `port_base` B: router B, router metrics B+1; with a second router in worker
mode, its API B+2 and metrics B+3; the demo's media origin B+7 (in this process; the only host
the workers fetch image URLs from unless `media_hosts` adds more); worker i (0-based) uses
B+10+10i (gRPC), +1 (HTTP, /metrics), +2 (ZMQ PUB), +3 (ZMQ replay).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from mmlens.collectors.media_server import MediaServer
from mmlens.demo.media_origin import (
    MEDIA_PORT_OFFSET,
    allow_list,
    origin_url,
    start_origin,
)
from mmlens.demo.model_dirs import MODELS, ensure_model_dir
from mmlens.demo.procs import (
    HOST,
    ClusterError,
    Proc,
    require_free,
    smg_command,
    spawn,
    with_repo_on_path,
)

SMG_DRAIN_S = 12.0
# SMG's --shutdown-grace-period-secs (its default 180): measured on 1.13, an idle SMG with the
# default takes 5.2 s to exit on SIGTERM, with 2 it takes 1.15 s, with 1 0.74 s; 1 s still lets
# a demo's in-flight requests (tens of ms each on the stand-in engines) finish.
SMG_SHUTDOWN_GRACE_S = 1


@dataclass
class ClusterConfig:
    family: str = "qwen3-vl"
    workers: int = 2
    # vllm | sglang, or one per worker ("vllm,sglang"): the wire protocols workers speak
    engine: str = "vllm"
    connection: str = "grpc"  # grpc | http
    port_base: int = 18400
    mm_processing: str | None = None  # SMG --mm-processing: auto | router | worker
    worker_mm_processor: bool = False  # workers advertise mm_processor (worker mode)
    count_drift: list[int] = field(default_factory=list)  # per worker, default 0
    legacy_kv_encoding: bool = False
    block_size: int = 16
    num_blocks: int = 2048
    speed: float = 1.0
    max_image_bytes: int | None = None
    allow_private_media: bool = True
    # host:port entries the workers may fetch image URLs from besides the demo's own media
    # origin (B+7), for images served elsewhere (`--media-host`).
    media_hosts: list[str] = field(default_factory=list)
    log_dir: Path | None = None
    model_cache: Path | None = None
    smg_log_level: str = "debug"
    ready_timeout: float = 60.0
    extra_smg_args: list[str] = field(default_factory=list)
    # A second SMG over the same workers with --mm-processing worker (the first then runs
    # --mm-processing router): the same request can be sent both ways.
    worker_mode_router: bool = False

    def worker_ports(self, i: int) -> dict[str, int]:
        base = self.port_base + 10 + 10 * i
        return {"grpc": base, "http": base + 1, "kv": base + 2, "replay": base + 3}

    @property
    def media_port(self) -> int:
        return self.port_base + MEDIA_PORT_OFFSET


def ports_needed(cfg: ClusterConfig) -> list[int]:
    ports = [cfg.port_base, cfg.port_base + 1, cfg.media_port]
    if cfg.worker_mode_router:
        ports += [cfg.port_base + 2, cfg.port_base + 3]
    for i in range(cfg.workers):
        ports += list(cfg.worker_ports(i).values())
    return ports


@dataclass(frozen=True)
class RouterSpec:
    """One SMG process of the demo: its name in the ready line, ports and processing mode."""

    name: str
    port: int
    metrics_port: int
    mm_processing: str | None  # --mm-processing, None: SMG's default (auto)
    log: str  # log file name in the log dir

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.metrics_port}/metrics"


class Cluster:
    def __init__(self, cfg: ClusterConfig) -> None:
        if cfg.connection not in ("grpc", "http"):
            raise ValueError("connection must be grpc or http")
        if not set(cfg.engine.split(",")) <= {"vllm", "sglang"}:
            raise ValueError("engine must be vllm or sglang (or one per worker, comma-separated)")
        if cfg.family not in MODELS:
            raise ValueError(f"unknown demo model {cfg.family!r}; choose from {sorted(MODELS)}")
        if cfg.worker_mode_router and (cfg.connection != "grpc" or cfg.engine != "vllm"):
            raise ValueError("a worker-mode router needs gRPC vLLM workers (SMG forwards images "
                             "only to vLLM gRPC workers that advertise mm_processor)")
        self.cfg = cfg
        self.model = MODELS[cfg.family]
        self.procs: list[Proc] = []
        # A log dir we made ourselves goes away with the cluster; pass one to keep the logs.
        self._own_log_dir = cfg.log_dir is None
        self.log_dir = cfg.log_dir or Path(tempfile.mkdtemp(prefix="mmlens-demo-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.model_dir: Path | None = None
        self.router_procs: list[Proc] = []
        self.media_hosts = allow_list(cfg.media_port, cfg.media_hosts)  # ValueError if bad
        self.media: MediaServer | None = None

    @property
    def smg(self) -> Proc | None:
        """The first router's process."""
        return self.router_procs[0] if self.router_procs else None

    @property
    def routers(self) -> list[RouterSpec]:
        base = self.cfg.port_base
        if not self.cfg.worker_mode_router:
            return [RouterSpec("demo", base, base + 1, self.cfg.mm_processing, "smg.log")]
        return [RouterSpec("demo", base, base + 1, self.cfg.mm_processing or "router", "smg.log"),
                RouterSpec("demo-worker", base + 2, base + 3, "worker", "smg-worker.log")]

    @property
    def workers_advertise(self) -> bool:
        return self.cfg.worker_mm_processor or self.cfg.worker_mode_router

    # -- URLs ----------------------------------------------------------------------------
    @property
    def router_url(self) -> str:
        return self.routers[0].url

    @property
    def router_metrics_url(self) -> str:
        return self.routers[0].metrics_url

    def worker_url(self, i: int) -> str:
        p = self.cfg.worker_ports(i)
        scheme = self.cfg.connection
        return f"{scheme}://{HOST}:{p['grpc'] if scheme == 'grpc' else p['http']}"

    def ready_info(self) -> dict[str, Any]:
        workers = []
        for i in range(self.cfg.workers):
            p = self.cfg.worker_ports(i)
            workers.append({
                "name": f"w{i + 1}",
                "url": self.worker_url(i),
                "grpc": f"grpc://{HOST}:{p['grpc']}",
                "http": f"http://{HOST}:{p['http']}",
                "metrics": f"http://{HOST}:{p['http']}/metrics",
                "engine": self._engine(i),
                "kv_events": f"tcp://{HOST}:{p['kv']}",
                "kv_replay": f"tcp://{HOST}:{p['replay']}",
                # The same events on the engine's SubscribeKvEvents stream (what SMG reads).
                **({"kv_grpc": f"grpc://{HOST}:{p['grpc']}"}
                   if self.cfg.connection == "grpc" else {}),
                "kv_topic": "kv-events",
                # What it serves: its generation prompt marks where prompts end in its
                # decode blocks.
                "model": str(self.model_dir) if self.model_dir else self.cfg.family,
                "kv_encoding": "array" if self.cfg.legacy_kv_encoding or
                self._engine(i) == "sglang" else "map",
                "mm_processor": "inprocess" if self.workers_advertise else "",
                "count_drift": self._drift(i),
                "pid": self.procs[i].popen.pid if i < len(self.procs) else None,
            })
        routers = [{"name": r.name, "url": r.url, "metrics": r.metrics_url,
                    "log": str(self.log_dir / r.log), "mm_processing": r.mm_processing or "auto",
                    "pid": p.popen.pid if p else None}
                   for r, p in zip(self.routers, self._router_procs_padded(), strict=True)]
        return {
            "event": "ready",
            "router": self.router_url,
            "router_metrics": self.router_metrics_url,
            "connection": self.cfg.connection,
            "mm_processing": self.routers[0].mm_processing or "auto",
            "block_size": self.cfg.block_size,
            "workers": workers,
            "models": [self.model.ready_entry(self.model_dir)],
            "logs": str(self.log_dir),
            "router_log": str(self.log_dir / "smg.log"),
            "router_pid": self.smg.popen.pid if self.smg else None,
            # Every router of the demo (the first is `router` above).
            "routers": routers,
            # Where mmlens puts its URL images (PUT /media/<sha256>), and what the workers
            # fetch image URLs from (that origin first).
            "media_origin": origin_url(self.cfg.media_port),
            "media_hosts": self.media_hosts,
        }

    def _router_procs_padded(self) -> list[Proc | None]:
        procs: list[Proc | None] = list(self.router_procs)
        return procs + [None] * (len(self.routers) - len(procs))

    def _engine(self, i: int) -> str:
        engines = self.cfg.engine.split(",")
        return engines[i % len(engines)]

    def _drift(self, i: int) -> int:
        return self.cfg.count_drift[i] if i < len(self.cfg.count_drift) else 0

    # -- processes -----------------------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = spawn(self.log_dir, name, cmd, env)
        self.procs.append(proc)
        return proc

    def _worker_cmd(self, i: int) -> list[str]:
        p = self.cfg.worker_ports(i)
        cmd = [sys.executable, "-m", "mmlens.demo.worker", "--name", f"w{i + 1}",
               "--family", self.cfg.family, "--model-dir", str(self.model_dir),
               "--grpc-port", str(p["grpc"]), "--http-port", str(p["http"]),
               "--kv-port", str(p["kv"]), "--replay-port", str(p["replay"]),
               "--block-size", str(self.cfg.block_size),
               "--num-blocks", str(self.cfg.num_blocks), "--speed", str(self.cfg.speed),
               "--count-drift", str(self._drift(i)),
               "--allowed-media-hosts", ",".join(self.media_hosts),
               "--engine", self._engine(i)]
        if self.workers_advertise:
            cmd += ["--mm-processor", "inprocess"]
        if self.cfg.legacy_kv_encoding:
            cmd.append("--legacy-kv-encoding")
        if self.cfg.max_image_bytes:
            cmd += ["--max-image-bytes", str(self.cfg.max_image_bytes)]
        return cmd

    def _smg_cmd(self, router: RouterSpec) -> list[str]:
        cfg = self.cfg
        urls = [self.worker_url(i) for i in range(cfg.workers)]
        cmd = [*smg_command(), "launch", "--host", HOST, "--port", str(router.port),
               "--prometheus-host", HOST, "--prometheus-port", str(router.metrics_port),
               "--worker-urls", *urls, "--policy", "cache_aware",
               "--model-path", str(self.model_dir), "--log-level", cfg.smg_log_level,
               "--log-json", "--log-mm-timing",
               "--shutdown-grace-period-secs", str(SMG_SHUTDOWN_GRACE_S)]
        if router.mm_processing:
            cmd += ["--mm-processing", router.mm_processing]
        if cfg.allow_private_media:
            cmd.append("--mm-allow-private-media-hosts")
        # SMG 1.13 matches this list by host alone (measured: "127.0.0.1:PORT" refuses every
        # URL, the origin's too, "127.0.0.1" allows any loopback port). The origin's address
        # is its own (media_origin.ORIGIN_HOST), so the list names no host where another of
        # the demo's ports listens; the workers' host:port list is exact in any case.
        hosts = dict.fromkeys(h.rsplit(":", 1)[0] for h in self.media_hosts)
        cmd += ["--mm-allowed-media-domains", ",".join(hosts)]
        return cmd + cfg.extra_smg_args

    def start(self) -> dict[str, Any]:
        """Start everything and return the ready info; on failure nothing is left running."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> dict[str, Any]:
        require_free(ports_needed(self.cfg))
        deadline = time.monotonic() + self.cfg.ready_timeout
        self.model_dir = ensure_model_dir(self.cfg.family, self.cfg.model_cache)
        self.media = start_origin(self.cfg.media_port)
        env = with_repo_on_path(dict(os.environ))
        for i in range(self.cfg.workers):
            self._spawn(f"worker-w{i + 1}", self._worker_cmd(i), env)
        for i, proc in enumerate(list(self.procs)):
            self._wait_worker(proc, self.cfg.worker_ports(i)["http"], deadline)
        smg_env = dict(os.environ)
        smg_env.setdefault("SMG_CACHE_TRACE", "1")
        smg_env.setdefault("SMG_CACHE_TRACE_HEADER", "1")
        smg_env.setdefault("HF_HUB_OFFLINE", "1")
        for router in self.routers:
            name = router.log.removesuffix(".log")
            self.router_procs.append(self._spawn(name, self._smg_cmd(router), smg_env))
        for router, proc in zip(self.routers, self.router_procs, strict=True):
            self._wait_router(router, proc, deadline)
        return self.ready_info()

    def _wait_worker(self, proc: Proc, http_port: int, deadline: float) -> None:
        url = f"http://{HOST}:{http_port}/health"
        while time.monotonic() < deadline:
            proc.check_alive()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=0.5).status_code == 200:
                    return
            time.sleep(0.05)
        raise ClusterError(f"{proc.name} not ready in time; see {proc.log_path}")

    def _wait_router(self, router: RouterSpec, proc: Proc, deadline: float) -> None:
        n = self.cfg.workers
        want_stream = self.cfg.connection == "grpc"
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise ClusterError(f"{proc.name} exited ({proc.popen.returncode}):\n"
                                   f"{proc.tail()}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = httpx.get(router.url + "/readiness", timeout=0.5)
                if r.status_code == 200 and r.json().get("healthy_workers") == n:
                    if not want_stream or self._streams_connected(router) >= n:
                        return
            time.sleep(0.1)
        raise ClusterError(f"router {router.name} not ready in time; see {proc.log_path}:\n"
                           f"{proc.tail()}")

    def _streams_connected(self, router: RouterSpec) -> int:
        # A worker's KV stream is live once SMG has counted a heartbeat from it.
        text = httpx.get(router.metrics_url, timeout=0.5).text
        return sum(1 for line in text.splitlines()
                   if line.startswith("smg_kv_event_batches_total{")
                   and 'disposition="load_only"' in line)

    def is_router(self, proc: Proc) -> bool:
        return proc in self.router_procs

    def stop(self) -> None:
        """Stop the routers first (their drain lets in-flight requests finish on the
        workers), then the workers; SIGKILL whatever outlives its grace period."""
        first = [p for p in self.procs if p in self.router_procs]
        rest = [p for p in self.procs if p not in self.router_procs]
        for group, grace in ((first, SMG_DRAIN_S), (rest, 5.0)):
            for proc in group:
                proc.terminate()
            for proc in group:
                proc.reap(grace)
        self.procs.clear()
        self.router_procs.clear()
        if self.media is not None:
            self.media.close()
            self.media = None
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
