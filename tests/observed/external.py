"""External clusters for the observed-traffic tests: the real SMG (gRPC) or the real Dynamo
frontend in front of simulated workers this module starts itself, as a user's own cluster
(not through `mmlens demo`'s cluster objects). Everything binds 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from mmlens.demo.cluster import SMG_SHUTDOWN_GRACE_S
from mmlens.demo.model_dirs import ensure_model_dir
from mmlens.demo.procs import Proc, smg_command, spawn, with_repo_on_path

HOST = "127.0.0.1"
MODEL = "Qwen/Qwen3-VL-2B-Instruct"


@dataclass
class External:
    """Processes started for one test, stopped together (router first)."""

    log_dir: Path
    router_url: str = ""
    router_log: Path | None = None
    workers: list[dict[str, Any]] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)
    media_hosts: list[str] = field(default_factory=list)

    def stop(self) -> None:
        for group, grace in ((self.procs[-1:], 12.0), (self.procs[:-1], 5.0)):
            for p in group:
                p.terminate()
            for p in group:
                p.reap(grace)
        self.procs.clear()


def _wait(pred: Any, timeout: float, what: str, procs: list[Proc]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            p.check_alive(width=400)
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            if pred():
                return
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready within {timeout} s")


def start_workers(ext: External, base: int, n: int, otlp: str | None,
                  extra: list[str] | None = None) -> None:
    model_dir = ensure_model_dir("qwen3-vl")
    env = with_repo_on_path(dict(os.environ))
    for i in range(n):
        g, h, kv, rp = base + 10 * i, base + 10 * i + 1, base + 10 * i + 2, base + 10 * i + 3
        cmd = [sys.executable, "-m", "mmlens.demo.worker", "--name", f"w{i + 1}",
               "--family", "qwen3-vl", "--model-dir", str(model_dir), "--grpc-port", str(g),
               "--http-port", str(h), "--kv-port", str(kv), "--replay-port", str(rp),
               "--allowed-media-hosts", ",".join(ext.media_hosts), *(extra or [])]
        if otlp:
            cmd += ["--otlp-traces-endpoint", otlp]
        ext.procs.append(spawn(ext.log_dir, f"worker-w{i + 1}", cmd, env))
        ext.workers.append({"name": f"w{i + 1}", "grpc": f"grpc://{HOST}:{g}",
                            "http": f"http://{HOST}:{h}", "kv_events": f"tcp://{HOST}:{kv}",
                            "kv_replay": f"tcp://{HOST}:{rp}", "model": str(model_dir)})
    for w in ext.workers:
        _wait(lambda w=w: httpx.get(w["http"] + "/health", timeout=0.5).status_code == 200,
              20, w["name"], ext.procs)


@contextlib.contextmanager
def smg_cluster(base: int, *, otlp_grpc: str | None = None, worker_otlp: str | None = None,
                workers: int = 2, cache_trace_header: bool = False,
                log_dir: Path | None = None, media_hosts: Sequence[str] = (),
                smg_args: Sequence[str] = (), worker_args: Sequence[str] = (),
                ) -> Iterator[External]:
    """Two simulated gRPC vLLM workers (ports base+10…), then SMG 1.13 on `base` (metrics
    base+1) with JSON debug logs and the cache trace; `otlp_grpc` (host:port) turns tracing
    on in SMG and in the workers. `smg_args` and `worker_args` are added to their command
    lines."""
    ext = External(Path(log_dir or tempfile.mkdtemp(prefix="mmlens-ext-")))
    ext.media_hosts = list(media_hosts)  # host:port the workers may fetch images from
    ext.log_dir.mkdir(parents=True, exist_ok=True)
    try:
        start_workers(ext, base + 10, workers, worker_otlp, list(worker_args))
        env = dict(os.environ, SMG_CACHE_TRACE="1", HF_HUB_OFFLINE="1")
        if cache_trace_header:  # the compact prediction as a response header (for the tap)
            env["SMG_CACHE_TRACE_HEADER"] = "1"
        cmd = [*smg_command(), "launch", "--host", HOST, "--port", str(base),
               "--prometheus-host", HOST, "--prometheus-port", str(base + 1),
               "--worker-urls", *[w["grpc"] for w in ext.workers], "--policy", "cache_aware",
               "--model-path", str(ensure_model_dir("qwen3-vl")), "--log-level", "debug",
               "--log-json", "--log-mm-timing", "--mm-allow-private-media-hosts",
               "--shutdown-grace-period-secs", str(SMG_SHUTDOWN_GRACE_S), *smg_args]
        if otlp_grpc:
            cmd += ["--enable-trace", "--otlp-traces-endpoint", otlp_grpc]
        ext.procs.append(spawn(ext.log_dir, "smg", cmd, env))
        ext.router_url = f"http://{HOST}:{base}"
        ext.router_log = ext.log_dir / "smg.log"

        def ready() -> bool:
            r = httpx.get(ext.router_url + "/readiness", timeout=0.5)
            if r.status_code != 200 or r.json().get("healthy_workers") != workers:
                return False
            text = httpx.get(f"http://{HOST}:{base + 1}/metrics", timeout=0.5).text
            return sum(1 for ln in text.splitlines() if ln.startswith(
                "smg_kv_event_batches_total{") and 'disposition="load_only"' in ln) >= workers

        _wait(ready, 30, "SMG", ext.procs)
        yield ext
    finally:
        ext.stop()


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, default=str))


@contextlib.contextmanager
def dynamo_cluster(base: int, *, otlp_grpc: str | None = None, worker_otlp: str | None = None,
                   workers: int = 2, log_dir: Path | None = None,
                   cache_trace_header: bool = False, media_hosts: Sequence[str] = (),
                   worker_args: Sequence[str] = (),
                   ) -> Iterator[External]:
    """The real Dynamo 1.6.1 frontend (`--router-mode kv`, file discovery, loopback ZMQ
    broker) on `base` in front of simulated vLLM engines registered with the Dynamo runtime;
    `otlp_grpc` (host:port) turns on the frontend's OTLP export."""
    from mmlens.demo.dynamo_broker import broker_url
    from mmlens.demo.dynamo_env import loopback_env

    ext = External(Path(log_dir or tempfile.mkdtemp(prefix="mmlens-ext-")))
    ext.media_hosts = list(media_hosts)  # host:port the workers may fetch images from
    ext.log_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="mmlens-ext-dyn-"))
    try:
        model_dir = ensure_model_dir("qwen3-vl")
        env = loopback_env(scratch, broker_url(base + 2, base + 3))
        ext.procs.append(spawn(ext.log_dir, "broker", [
            sys.executable, "-m", "mmlens.demo.dynamo_broker", "--xsub-port", str(base + 2),
            "--xpub-port", str(base + 3)], env, cwd=scratch))
        for i in range(workers):
            p = base + 10 + 10 * i
            wenv = dict(env, DYN_SYSTEM_PORT=str(p))
            cmd = [sys.executable, "-m", "mmlens.demo.dynamo_engine", "--name", f"w{i + 1}",
                   "--family", "qwen3-vl", "--model-dir", str(model_dir), "--block-size", "16",
                   "--allowed-media-hosts", ",".join(ext.media_hosts),
                   "--zmq-kv-port", str(p + 1),
                   "--zmq-replay-port", str(p + 2), "--kv-path", "pad", *worker_args]
            if worker_otlp:
                cmd += ["--otlp-traces-endpoint", worker_otlp]
            ext.procs.append(spawn(ext.log_dir, f"worker-w{i + 1}", cmd, wenv, cwd=scratch))
            # Its log holds the Dynamo runtime's own ingress lines (a production worker's).
            ext.workers.append({"name": f"w{i + 1}", "metrics": f"http://{HOST}:{p}/metrics",
                                "kv_events": f"tcp://{HOST}:{p + 1}",
                                "kv_replay": f"tcp://{HOST}:{p + 2}",
                                "log": str(ext.log_dir / f"worker-w{i + 1}.log"),
                                "model": str(model_dir)})
        fenv = dict(env)
        if otlp_grpc:
            fenv.update(OTEL_EXPORT_ENABLED="1", OTEL_SERVICE_NAME="dynamo-frontend",
                        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"http://{otlp_grpc}",
                        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{otlp_grpc}")
        ext.procs.append(spawn(ext.log_dir, "frontend", [
            sys.executable, "-m", "dynamo.frontend", "--http-host", HOST, "--http-port",
            str(base), "--router-mode", "kv", "--discovery-backend", "file",
            "--request-plane", "tcp", "--event-plane", "zmq"], fenv, cwd=scratch))
        ext.router_url = f"http://{HOST}:{base}"
        ext.router_log = ext.log_dir / "frontend.log"

        def ready() -> bool:
            r = httpx.get(ext.router_url + "/v1/models", timeout=1.0)
            if not any(m.get("id") == MODEL for m in r.json().get("data", [])):
                return False
            text = httpx.get(ext.router_url + "/metrics", timeout=1.0).text
            return text.count("dynamo_component_router_worker_registered{") >= workers

        _wait(ready, 60, "Dynamo frontend", ext.procs)
        for i, w in enumerate(ext.workers):
            for line in (ext.log_dir / f"worker-w{i + 1}.log").read_text().splitlines():
                if '"event": "worker_ready"' in line:
                    w["worker_id"] = str(json.loads(line[line.index("{"):]).get("worker_id"))
        yield ext
    finally:
        ext.stop()
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
