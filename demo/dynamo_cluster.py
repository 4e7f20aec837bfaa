"""Start and stop the Dynamo demo: the real Dynamo 1.6.1 frontend (KV router) in front of
simulated vLLM workers registered with the Dynamo runtime, all on 127.0.0.1.

- Discovery through files (`--discovery-backend file`), TCP request plane, ZMQ event plane in
  broker mode against the demo's loopback XSUB/XPUB relay (direct mode binds all interfaces);
  or, with `event_plane="nats"`, production shape: etcd discovery and the NATS event plane,
  with the demo's own `etcd` and `nats-server` (Debian `etcd-server`, `nats-server`).
- HOME, XDG_CACHE_HOME, HF_HOME, the discovery store and TMPDIR live in a scratch folder the
  demo owns and removes; the Hub is offline.
- The frontend logs JSON lines (`DYN_LOGGING_JSONL`) with the routing and mm_routing targets
  at debug to `frontend.log` in the log folder, for mmlens' log collector.
- The block size comes from the model: the workers register it and the frontend reads it
  from their model card (no `--kv-cache-block-size`).

Port layout from `port_base` B: frontend B, broker XSUB B+2 / XPUB B+3 (ZMQ plane) or etcd
client B+4 / peer B+5 and NATS B+6 (NATS plane); the demo's media origin B+7 (in this process;
the only host the workers fetch image URLs from unless `media_hosts` adds more); worker i
(0-based): system server (/metrics) B+10+10i, vLLM-format ZMQ KV events +1, replay +2.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from mmlens.collectors.media_server import MediaServer
from mmlens.demo.dynamo_broker import broker_url
from mmlens.demo.dynamo_env import infra_missing, loopback_env, nats_env
from mmlens.demo.media_origin import (
    MEDIA_PORT_OFFSET,
    allow_list,
    origin_url,
    start_origin,
)
from mmlens.demo.model_dirs import MODELS, ensure_model_dir
from mmlens.demo.procs import HOST, ClusterError, Proc, require_free, spawn

STOP_GRACE_S = 5.0
TAIL_WIDTH = 400  # characters per log line quoted in an error
# Dynamo 1.6.1 builds Kimi-K3's dims-bearing media block only with a tokenizer backend that
# can encode segments: with the default (HuggingFace) backend it logs "tokenizer backend does
# not support segmented encoding" and with fastokens "MM-aware KV routing disabled", and routes
# on the text prefix only; basetenkenizer enables exact routing for the demo's K3 directory.
FAMILY_TOKENIZER = {"kimi-k3": "basetenkenizer"}


def dynamo_available() -> str | None:
    """None when the Dynamo extra is importable, else the reason it is not."""
    try:
        if importlib.util.find_spec("dynamo.frontend") is None:
            return "Dynamo is not installed (no dynamo.frontend); see requirements-dynamo.txt"
        importlib.import_module("dynamo.llm")  # loads the native runtime
    except Exception as exc:  # ImportError, or a broken native module
        return f"Dynamo is not installed ({type(exc).__name__}: {exc}); see requirements-dynamo.txt"
    return None


@dataclass
class DynamoClusterConfig:
    family: str = "qwen3-vl"
    workers: int = 2
    port_base: int = 18500
    router_kv_events: bool = True  # False: frontend --no-router-kv-events (approximate mode)
    count_drift: list[int] = field(default_factory=list)  # per worker, default 0
    block_size: int = 16  # what the workers register; the frontend takes it from them
    num_blocks: int = 4096
    speed: float = 1.0
    zmq_kv_events: bool = True  # workers also publish vLLM-format ZMQ events for mmlens
    # "pad": workers push pad-value events through Dynamo's publisher; "vllm-zmq": Dynamo
    # subscribes to the workers' raw vLLM-format ZMQ events and normalizes them itself.
    kv_path: str = "pad"
    zmq_legacy_encoding: bool = False
    media_hosts: list[str] = field(default_factory=list)  # besides B+7; see ClusterConfig
    log_dir: Path | None = None
    scratch_dir: Path | None = None
    model_cache: Path | None = None
    ready_timeout: float = 40.0
    # Frontend tokenizer backend (`--tokenizer`); None: per family (`FAMILY_TOKENIZER`).
    tokenizer_backend: str | None = None
    extra_frontend_args: list[str] = field(default_factory=list)
    # "zmq": file discovery + ZMQ broker; "nats": etcd discovery + NATS (production shape).
    event_plane: str = "zmq"

    @property
    def frontend_port(self) -> int:
        return self.port_base

    @property
    def infra_ports(self) -> dict[str, int]:
        return {"etcd": self.port_base + 4, "etcd_peer": self.port_base + 5,
                "nats": self.port_base + 6}

    @property
    def media_port(self) -> int:
        return self.port_base + MEDIA_PORT_OFFSET

    @property
    def broker_ports(self) -> tuple[int, int]:
        return self.port_base + 2, self.port_base + 3

    def worker_ports(self, i: int) -> dict[str, int]:
        base = self.port_base + 10 + 10 * i
        return {"system": base, "kv": base + 1, "replay": base + 2}

    def drift(self, i: int) -> int:
        return self.count_drift[i] if i < len(self.count_drift) else 0


def ports_needed(cfg: DynamoClusterConfig) -> list[int]:
    ports = [cfg.frontend_port, cfg.media_port, *(cfg.broker_ports if cfg.event_plane == "zmq"
                                  else cfg.infra_ports.values())]
    for i in range(cfg.workers):
        p = cfg.worker_ports(i)
        ports += [p["system"]] + ([p["kv"], p["replay"]] if cfg.zmq_kv_events else [])
    return ports


_READY = re.compile(r'\{"event": "worker_ready".*\}')


class DynamoCluster:
    def __init__(self, cfg: DynamoClusterConfig) -> None:
        if cfg.family not in MODELS:
            raise ValueError(f"unknown demo model {cfg.family!r}; choose from {sorted(MODELS)}")
        if cfg.kv_path not in ("pad", "vllm-zmq"):
            raise ValueError("kv_path must be pad or vllm-zmq")
        if cfg.event_plane not in ("zmq", "nats"):
            raise ValueError("event_plane must be zmq or nats")
        if cfg.kv_path == "vllm-zmq":
            cfg.zmq_kv_events = True  # Dynamo reads the workers' ZMQ events
        self.cfg = cfg
        self.model = MODELS[cfg.family]
        self.procs: list[Proc] = []
        self._own_logs = cfg.log_dir is None  # a temporary log folder goes at stop
        self.log_dir = cfg.log_dir or Path(tempfile.mkdtemp(prefix="mmlens-dynamo-logs-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._own_scratch = cfg.scratch_dir is None
        self.scratch = cfg.scratch_dir or Path(tempfile.mkdtemp(prefix="mmlens-dynamo-"))
        self.model_dir: Path | None = None
        self.frontend: Proc | None = None
        self.workers: list[Proc] = []
        self.worker_info: list[dict[str, Any]] = []
        self.media_hosts = allow_list(cfg.media_port, cfg.media_hosts)  # ValueError if bad
        self.media: MediaServer | None = None

    # -- URLs ----------------------------------------------------------------------------
    @property
    def router_url(self) -> str:
        return f"http://{HOST}:{self.cfg.frontend_port}"

    @property
    def frontend_log(self) -> Path:
        return self.log_dir / "frontend.log"

    def ready_info(self) -> dict[str, Any]:
        xsub, xpub = self.cfg.broker_ports
        workers = []
        for i, info in enumerate(self.worker_info):
            p = self.cfg.worker_ports(i)
            w: dict[str, Any] = {
                "name": info.get("name", f"w{i + 1}"),
                "worker_id": str(info.get("worker_id")),
                "metrics": f"http://{HOST}:{p['system']}/metrics",
                "count_drift": self.cfg.drift(i),
                "log": str(self.workers[i].log_path),
                "pid": self.workers[i].popen.pid,
            }
            if self.cfg.zmq_kv_events:
                w.update(kv_events=f"tcp://{HOST}:{p['kv']}",
                         kv_replay=f"tcp://{HOST}:{p['replay']}", kv_topic="kv-events",
                         kv_encoding="map")
            workers.append(w)
        return {
            "event": "ready",
            "router_kind": "dynamo",
            "router": self.router_url,
            "router_metrics": f"{self.router_url}/metrics",
            "router_log": str(self.frontend_log),
            "router_kv_events": self.cfg.router_kv_events,
            "tokenizer_backend": (self.cfg.tokenizer_backend
                                  or FAMILY_TOKENIZER.get(self.cfg.family, "default")),
            "block_size": self.cfg.block_size,
            **self._plane_info(xsub, xpub),
            "workers": workers,
            "models": [self.model.ready_entry(self.model_dir)],
            "logs": str(self.log_dir),
            "router_pid": self.frontend.popen.pid if self.frontend else None,
            "media_origin": origin_url(self.cfg.media_port),  # see Cluster.ready_info
            "media_hosts": self.media_hosts,
        }

    def _plane_info(self, xsub: int, xpub: int) -> dict[str, Any]:
        """Where the router's KV events travel (mmlens reads them there too)."""
        if self.cfg.event_plane == "nats":
            p = self.cfg.infra_ports
            return {"discovery": "etcd", "etcd": f"http://{HOST}:{p['etcd']}",
                    "nats": f"nats://{HOST}:{p['nats']}",
                    "event_plane": f"nats://{HOST}:{p['nats']}"}
        return {"discovery": "file",
                "broker": {"xsub": f"tcp://{HOST}:{xsub}", "xpub": f"tcp://{HOST}:{xpub}"},
                "event_plane": f"tcp://{HOST}:{xpub}"}

    # -- processes -----------------------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> Proc:
        # SIGKILL, not SIGTERM, when the demo process dies: Dynamo 1.6.1 processes can linger
        # after their graceful-shutdown phases.
        proc = spawn(self.log_dir, name, cmd, env, cwd=self.scratch,
                     death_signal=signal.SIGKILL)
        self.procs.append(proc)
        return proc

    def _worker_cmd(self, i: int) -> list[str]:
        cfg = self.cfg
        p = cfg.worker_ports(i)
        cmd = [sys.executable, "-m", "mmlens.demo.dynamo_engine", "--name", f"w{i + 1}",
               "--family", cfg.family, "--model-dir", str(self.model_dir),
               "--block-size", str(cfg.block_size), "--num-blocks", str(cfg.num_blocks),
               "--speed", str(cfg.speed), "--count-drift", str(cfg.drift(i)),
               "--allowed-media-hosts", ",".join(self.media_hosts)]
        if cfg.zmq_kv_events or cfg.kv_path == "vllm-zmq":
            cmd += ["--zmq-kv-port", str(p["kv"]), "--zmq-replay-port", str(p["replay"])]
        cmd += ["--kv-path", cfg.kv_path]
        if cfg.event_plane == "nats":
            cmd += ["--discovery-backend", "etcd", "--event-plane", "nats"]
        if cfg.zmq_legacy_encoding:
            cmd.append("--zmq-legacy-encoding")
        if not cfg.router_kv_events:
            cmd.append("--no-kv-events")
        return cmd

    def _frontend_cmd(self) -> list[str]:
        cmd = [sys.executable, "-m", "dynamo.frontend", "--http-host", HOST,
               "--http-port", str(self.cfg.frontend_port), "--router-mode", "kv",
               "--request-plane", "tcp"]
        cmd += (["--discovery-backend", "etcd", "--event-plane", "nats"]
                if self.cfg.event_plane == "nats" else
                ["--discovery-backend", "file", "--event-plane", "zmq"])
        if not self.cfg.router_kv_events:
            cmd.append("--no-router-kv-events")
        backend = self.cfg.tokenizer_backend or FAMILY_TOKENIZER.get(self.cfg.family)
        if backend and backend != "default":
            cmd += ["--tokenizer", backend]
        return cmd + self.cfg.extra_frontend_args

    def start(self) -> dict[str, Any]:
        reason = dynamo_available()
        if reason:
            raise ClusterError(reason)
        require_free(ports_needed(self.cfg))
        deadline = time.monotonic() + self.cfg.ready_timeout
        self.model_dir = ensure_model_dir(self.cfg.family, self.cfg.model_cache)
        self.media = start_origin(self.cfg.media_port)
        xsub, xpub = self.cfg.broker_ports
        env = loopback_env(self.scratch, broker_url(xsub, xpub))
        if self.cfg.event_plane == "nats":
            env = self._start_infra(env, deadline)
        else:
            broker = self._spawn("broker", [sys.executable, "-m", "mmlens.demo.dynamo_broker",
                                            "--xsub-port", str(xsub), "--xpub-port", str(xpub)],
                                 env)
            self._wait_line(broker, '"broker_ready"', deadline)
        for i in range(self.cfg.workers):
            wenv = dict(env, DYN_SYSTEM_PORT=str(self.cfg.worker_ports(i)["system"]))
            self.workers.append(self._spawn(f"worker-w{i + 1}", self._worker_cmd(i), wenv))
        self.frontend = self._spawn("frontend", self._frontend_cmd(), env)
        self.worker_info = [self._worker_ready(w, deadline) for w in self.workers]
        self._wait_frontend(deadline)
        return self.ready_info()

    def _start_infra(self, env: dict[str, str], deadline: float) -> dict[str, str]:
        """etcd and nats-server on loopback, their data in the scratch folder."""
        missing = infra_missing()
        if missing:
            raise ClusterError(missing)
        p = self.cfg.infra_ports
        etcd_url, peer_url = f"http://{HOST}:{p['etcd']}", f"http://{HOST}:{p['etcd_peer']}"
        etcd = self._spawn("etcd", [
            "etcd", "--name", "mmlens-demo", "--data-dir", str(self.scratch / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"mmlens-demo={peer_url}"], env)
        nats = self._spawn("nats", [
            "nats-server", "-a", HOST, "-p", str(p["nats"]), "-js",
            "-sd", str(self.scratch / "nats")], env)
        self._wait_line(etcd, "ready to serve client requests", deadline)
        self._wait_line(nats, "Server is ready", deadline)
        return nats_env(env, p["etcd"], p["nats"])

    def _wait_line(self, proc: Proc, marker: str, deadline: float) -> str:
        while time.monotonic() < deadline:
            proc.check_alive(TAIL_WIDTH)
            with contextlib.suppress(OSError):
                for line in proc.log_path.read_text(errors="replace").splitlines():
                    if marker in line:
                        return line
            time.sleep(0.05)
        raise ClusterError(f"{proc.name} not ready in time; see {proc.log_path}:\n"
                           f"{proc.tail(width=TAIL_WIDTH)}")

    def _worker_ready(self, proc: Proc, deadline: float) -> dict[str, Any]:
        line = self._wait_line(proc, '"event": "worker_ready"', deadline)
        m = _READY.search(line)
        return json.loads(m.group(0)) if m else {}

    def _registered_workers(self) -> int:
        text = httpx.get(f"{self.router_url}/metrics", timeout=1.0).text
        ids = {str(w.get("worker_id")) for w in self.worker_info}
        seen = set(re.findall(
            r'^dynamo_component_router_worker_registered\{[^}]*router_worker_id="(\d+)"[^}]*\}'
            r"\s+1(?:\.0)?\s*$", text, flags=re.M))
        return len(ids & seen)

    def _wait_frontend(self, deadline: float) -> None:
        assert self.frontend is not None
        name = self.model.served_name
        while time.monotonic() < deadline:
            for proc in (self.frontend, *self.workers):
                proc.check_alive(TAIL_WIDTH)
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = httpx.get(f"{self.router_url}/v1/models", timeout=1.0)
                listed = r.status_code == 200 and any(
                    m.get("id") == name for m in r.json().get("data", []))
                if listed and self._registered_workers() >= self.cfg.workers:
                    return
            time.sleep(0.1)
        raise ClusterError(f"frontend not ready in time; see {self.frontend_log}:\n"
                           f"{self.frontend.tail(width=TAIL_WIDTH)}")

    def stop(self) -> None:
        """SIGTERM every process group (frontend first), then SIGKILL what is left: Dynamo's
        runtime can linger after its shutdown phases."""
        # Frontend, then workers, then what they lean on (broker, or etcd and NATS).
        first = ([self.frontend] if self.frontend else []) + self.workers
        order = first + [p for p in self.procs if p not in first]
        for proc in order:
            proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in order:
            proc.reap(max(0.1, deadline - time.monotonic()))
        self.procs.clear()
        self.workers.clear()
        self.frontend = None
        if self.media is not None:
            self.media.close()
            self.media = None
        if self._own_scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
        if self._own_logs:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> DynamoCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
