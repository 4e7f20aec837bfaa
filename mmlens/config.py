"""Collector targets from ``mmlens.toml`` (path by flag or ``MMLENS_CONFIG``).

```toml
interval_s = 5                      # scrape / poll period
timeout_s = 2                       # per request
[store]
retention_s = 86400
max_mb = 512
[prometheus]
url = "http://127.0.0.1:9090"
[[router]]
name = "smg"
kind = "smg"                        # smg | dynamo | auto
url = "http://127.0.0.1:30000"
metrics_url = "http://127.0.0.1:29000/metrics"
api_key_env = "SMG_API_KEY"         # the NAME of an environment variable, never the key
discover_workers = true             # add workers listed by SMG GET /workers
log_file = "smg.log"                # optional JSON log to follow
event_plane = "nats://127.0.0.1:4222"   # Dynamo: its KV events as the router hears them
                                    # (NATS, or tcp://host:port = the ZMQ broker's xpub side)
namespace = "dynamo"                # Dynamo namespace on the event plane (default: any)
[[worker]]
name = "w1"
engine = "vllm"                     # vllm | sglang
router_url = "grpc://127.0.0.1:50051"   # how the router names it
metrics_url = "http://127.0.0.1:18001/metrics"
kv_events = "tcp://127.0.0.1:5557"   # vLLM/SGLang ZMQ; grpc://host:port = the worker's
                                    # SubscribeKvEvents stream (SMG gRPC deployments)
kv_replay = "tcp://127.0.0.1:5558"
dp_size = 1                         # ranks > 0 listen on port + rank
topic = ""
[demo]
ready_file = "demo-ready.json"      # targets from `mmlens demo --ready-file`
[otlp]                              # built-in OTLP trace receiver (off without this table)
host = "127.0.0.1"
grpc_port = 4317                    # 0 picks a free port; omit to leave gRPC off
http_port = 4318                    # POST /v1/traces, application/x-protobuf
kv_transport = "zmq"                # zmq | grpc: which of the demo workers' streams to read
```
Secrets never live in the file: a key named like a secret is rejected.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ENV_CONFIG = "MMLENS_CONFIG"
_SECRET_KEYS = {"api_key", "apikey", "token", "password", "secret", "bearer", "authorization"}


class ConfigError(ValueError):
    pass


@dataclass(slots=True)
class RouterTarget:
    name: str
    kind: str
    url: str
    metrics_url: str | None = None
    api_key_env: str | None = None
    discover_workers: bool = True
    log_file: str | None = None
    indexer_url: str | None = None  # Dynamo standalone kv-indexer (GET /dump)
    event_plane: str | None = None  # Dynamo: nats://… or the ZMQ broker's xpub tcp://…
    namespace: str = "*"

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None


@dataclass(slots=True)
class WorkerTarget:
    name: str
    engine: str = "vllm"
    router_url: str | None = None
    metrics_url: str | None = None
    kv_events: str | None = None
    kv_replay: str | None = None
    dp_size: int = 1
    topic: str = ""

    @property
    def kv_transport(self) -> str | None:
        """``grpc`` (SubscribeKvEvents stream), ``zmq`` or None (no KV events configured)."""
        if not self.kv_events:
            return None
        return "grpc" if self.kv_events.startswith(("grpc://", "grpcs://")) else "zmq"

    def kv_endpoints(self) -> list[tuple[int, str, str | None]]:
        """``(rank, pub endpoint, replay endpoint)`` per DP rank (port + rank), ZMQ only."""
        if not self.kv_events or self.kv_transport != "zmq":
            return []
        return [(r, offset_endpoint(self.kv_events, r),
                 offset_endpoint(self.kv_replay, r) if self.kv_replay else None)
                for r in range(self.dp_size)]


@dataclass(slots=True)
class Config:
    routers: list[RouterTarget] = field(default_factory=list)
    workers: list[WorkerTarget] = field(default_factory=list)
    prometheus_url: str | None = None
    interval_s: float = 5.0
    timeout_s: float = 2.0
    retention_s: float = 86400.0
    max_mb: float = 512.0
    ready_file: str | None = None
    demo_kv_transport: str = "zmq"
    base_dir: Path = Path(".")
    otlp_host: str = "127.0.0.1"
    otlp_grpc_port: int | None = None
    otlp_http_port: int | None = None

    def add_worker(self, worker: WorkerTarget) -> bool:
        known = {w.name for w in self.workers} | {w.router_url for w in self.workers}
        if worker.name in known or (worker.router_url and worker.router_url in known):
            return False
        self.workers.append(worker)
        return True


def offset_endpoint(endpoint: str, rank: int) -> str:
    """vLLM/SGLang DP rule: ``tcp://h:5557`` → port + rank; ``ipc``/``inproc`` get ``_dp{rank}``."""
    if rank == 0:
        return endpoint
    if endpoint.startswith(("ipc://", "inproc://")):
        return f"{endpoint}_dp{rank}"
    parts = urlsplit(endpoint)
    if parts.port is None:
        raise ConfigError(f"cannot offset endpoint without a port: {endpoint}")
    host = parts.hostname or "127.0.0.1"
    return urlunsplit((parts.scheme, f"{host}:{parts.port + rank}", parts.path, "", ""))


def _reject_secrets(table: dict[str, Any], where: str) -> None:
    for key, value in table.items():
        if key.lower() in _SECRET_KEYS:
            raise ConfigError(f"{where}.{key}: secrets come from environment variables; "
                              f"name the variable with {key}_env")
        if isinstance(value, dict):
            _reject_secrets(value, f"{where}.{key}")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    _reject_secrets(item, f"{where}.{key}[{i}]")


def _str(table: dict[str, Any], key: str, where: str, required: bool = False) -> str | None:
    value = table.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{where}: missing {key}")
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{where}.{key}: expected a string")
    return value


def parse_config(doc: dict[str, Any], base_dir: Path = Path(".")) -> Config:
    _reject_secrets(doc, "mmlens.toml")
    cfg = Config(base_dir=base_dir)
    cfg.interval_s = float(doc.get("interval_s", cfg.interval_s))
    cfg.timeout_s = float(doc.get("timeout_s", cfg.timeout_s))
    store = doc.get("store", {})
    cfg.retention_s = float(store.get("retention_s", cfg.retention_s))
    cfg.max_mb = float(store.get("max_mb", cfg.max_mb))
    cfg.prometheus_url = _str(doc.get("prometheus", {}), "url", "prometheus")
    for i, r in enumerate(doc.get("router", [])):
        where = f"router[{i}]"
        kind = r.get("kind", "auto")
        if kind not in ("smg", "dynamo", "auto"):
            raise ConfigError(f"{where}.kind: expected smg, dynamo or auto")
        log_file = _str(r, "log_file", where)
        cfg.routers.append(RouterTarget(
            name=_str(r, "name", where) or f"router{i}", kind=kind,
            url=_str(r, "url", where, required=True) or "",
            metrics_url=_str(r, "metrics_url", where),
            api_key_env=_str(r, "api_key_env", where),
            discover_workers=bool(r.get("discover_workers", True)),
            indexer_url=_str(r, "indexer_url", where),
            event_plane=_event_plane(r, where),
            namespace=_str(r, "namespace", where) or "*",
            log_file=str(base_dir / log_file) if log_file else None))
    for i, w in enumerate(doc.get("worker", [])):
        where = f"worker[{i}]"
        engine = w.get("engine", "vllm")
        if engine not in ("vllm", "sglang"):
            raise ConfigError(f"{where}.engine: expected vllm or sglang")
        dp = w.get("dp_size", 1)
        if not isinstance(dp, int) or not 1 <= dp <= 1024:
            raise ConfigError(f"{where}.dp_size: expected 1..1024")
        cfg.workers.append(WorkerTarget(
            name=_str(w, "name", where) or f"worker{i}", engine=engine,
            router_url=_str(w, "router_url", where), metrics_url=_str(w, "metrics_url", where),
            kv_events=_str(w, "kv_events", where), kv_replay=_str(w, "kv_replay", where),
            dp_size=dp, topic=_str(w, "topic", where) or ""))
    otlp = doc.get("otlp", {})
    cfg.otlp_host = _str(otlp, "host", "otlp") or cfg.otlp_host
    for key in ("grpc_port", "http_port"):
        port = otlp.get(key)
        if port is not None and (not isinstance(port, int) or not 0 <= port <= 65535):
            raise ConfigError(f"otlp.{key}: expected a port number")
        setattr(cfg, f"otlp_{key}", port)
    ready = _str(doc.get("demo", {}), "ready_file", "demo")
    cfg.ready_file = str(base_dir / ready) if ready else None
    transport = _str(doc.get("demo", {}), "kv_transport", "demo") or "zmq"
    if transport not in ("zmq", "grpc"):
        raise ConfigError("demo.kv_transport: expected zmq or grpc")
    cfg.demo_kv_transport = transport
    return cfg


def _event_plane(table: dict[str, Any], where: str) -> str | None:
    url = _str(table, "event_plane", where)
    if url is None:
        return None
    scheme = urlsplit(url).scheme
    if scheme not in ("nats", "tls", "tcp") or not urlsplit(url).hostname:
        raise ConfigError(f"{where}.event_plane: expected nats://host:port or tcp://host:port "
                          f"(Dynamo's ZMQ broker, xpub side), got {url!r}")
    return url


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    path = path or os.environ.get(ENV_CONFIG)
    if not path:
        raise ConfigError(f"no config: pass --config or set {ENV_CONFIG}")
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{p}: {exc}") from None
    return parse_config(doc, p.parent)


def apply_ready(cfg: Config, ready: dict[str, Any]) -> None:
    """Add the demo's router and workers from its ready line (``{"event":"ready", …}``)."""
    if ready.get("event") != "ready":
        raise ConfigError("not a demo ready line")
    routers = ready.get("routers") or ([{
        "name": "demo", "url": ready["router"], "metrics": ready.get("router_metrics"),
        "log": ready.get("router_log")}] if ready.get("router") else [])
    for r in routers:
        if not any(t.url == r["url"] for t in cfg.routers):
            cfg.routers.append(RouterTarget(
                name=str(r.get("name") or "demo"), kind=str(ready.get("router_kind", "smg")),
                url=r["url"], metrics_url=r.get("metrics"), log_file=r.get("log"),
                event_plane=ready.get("event_plane")))
    grpc = cfg.demo_kv_transport == "grpc"
    for w in ready.get("workers", []):
        cfg.add_worker(WorkerTarget(
            name=str(w.get("name")), engine=str(w.get("engine", "vllm")),
            # SMG names a worker by its URL, Dynamo by its decimal worker id.
            router_url=w.get("url") or w.get("grpc") or w.get("http") or (
                str(w["worker_id"]) if w.get("worker_id") is not None else None),
            metrics_url=w.get("metrics"),
            kv_events=(w.get("kv_grpc") if grpc and w.get("kv_grpc") else w.get("kv_events")),
            kv_replay=None if grpc and w.get("kv_grpc") else w.get("kv_replay"),
            dp_size=int(w.get("dp_size", 1)), topic=str(w.get("kv_topic", ""))))


def read_ready_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    text = Path(path).read_text().strip()
    try:
        whole = json.loads(text)  # the demo pretty-prints its ready file
    except ValueError:
        whole = None
    if isinstance(whole, dict) and whole.get("event") == "ready":
        return whole
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            obj = json.loads(line)
            if obj.get("event") == "ready":
                return obj  # type: ignore[no-any-return]
    raise ConfigError(f"{path}: no ready line")


def smg_worker_target(url: str, labels: dict[str, str]) -> WorkerTarget:
    """A worker discovered from SMG ``/workers``: the router's name for it, nothing to scrape
    unless its labels say where (SMG reports neither a metrics nor a KV-event endpoint)."""
    return WorkerTarget(name=url, engine=labels.get("runtime_type", "vllm") if labels.get(
        "runtime_type") in ("vllm", "sglang") else "vllm", router_url=url)
