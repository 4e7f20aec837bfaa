"""Collector targets from ``mmlens.toml`` (path by flag or ``MMLENS_CONFIG``).

```toml
interval_s = 5                      # scrape / poll period
timeout_s = 2                       # per request
settle_s = 12                       # a request is judged and evaluated this long after it
                                    # ends, when late log lines and KV events are in (a
                                    # verdict is judged again if evidence comes later still)
log_dirs = ["/var/log/smg"]         # log files may also be read from these directories
                                    # (besides this file's own directory)
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
media_origin = "http://127.0.0.1:18407"  # where mmlens puts its URL test images (PUT
                                    # /media/<sha256>; the demo's origin); unset: a loopback
                                    # server of mmlens' own, which the workers must allow
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
log_file = "worker-w1.log"          # optional: the worker's own JSON log (Dynamo's runtime
                                    # logs when each request reached it, on its clock)
model = "qwen3-vl"                  # optional: the model it serves (a family or a model
                                    # directory): where prompts end in its decode blocks
[demo]
ready_file = "demo-ready.json"      # targets from `mmlens demo --ready-file`
[otlp]                              # built-in OTLP trace receiver (off without this table)
host = "127.0.0.1"
grpc_port = 4317                    # 0 picks a free port; omit to leave gRPC off
http_port = 4318                    # POST /v1/traces, application/x-protobuf
kv_transport = "zmq"                # zmq | grpc: which of the demo workers' streams to read
```
Secrets never live in the file: a key named like a secret is rejected. Every value is
checked (type, range, address scheme/host/port); a wrong one is a ``ConfigError`` naming it.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from mmlens import config_values as v
from mmlens.errors import ConfigError

ENV_CONFIG = "MMLENS_CONFIG"
_SECRET_KEYS = {"api_key", "apikey", "token", "password", "secret", "bearer", "authorization"}


__all__ = ["ConfigError"]


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
    media_origin: str | None = None  # an upload origin the workers fetch image URLs from

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
    # The worker's own JSON log (Dynamo's runtime): when each request reached it.
    log_file: str | None = None
    # The model it serves (a family name or a model directory): its generation prompt tells
    # where a prompt ended in the worker's decode blocks (``mmlens.ingest.prompt_end``).
    model: str | None = None

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
    settle_s: float = 12.0
    retention_s: float = 86400.0
    max_mb: float = 512.0
    ready_file: str | None = None
    demo_kv_transport: str = "zmq"
    base_dir: Path = Path(".")
    otlp_host: str = "127.0.0.1"
    otlp_grpc_port: int | None = None
    otlp_http_port: int | None = None
    log_dirs: list[Path] = field(default_factory=list)  # besides base_dir, for log files

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


def parse_config(doc: dict[str, Any], base_dir: Path = Path(".")) -> Config:
    _reject_secrets(doc, "mmlens.toml")
    cfg = Config(base_dir=base_dir)
    cfg.interval_s = v.number(doc, "interval_s", "", cfg.interval_s, 0.05, 86400)
    cfg.timeout_s = v.number(doc, "timeout_s", "", cfg.timeout_s, 0.01, 600)
    cfg.settle_s = v.number(doc, "settle_s", "", cfg.settle_s, 0, 3600)
    cfg.log_dirs = v.directories(doc, "log_dirs", base_dir)
    store = v.table(doc, "store")
    cfg.retention_s = v.number(store, "retention_s", "store.", cfg.retention_s, 1, 1e10)
    cfg.max_mb = v.number(store, "max_mb", "store.", cfg.max_mb, 1, 1e8)
    cfg.prometheus_url = v.endpoint(v.text(v.table(doc, "prometheus"), "url", "prometheus"),
                                    "prometheus.url", v.HTTP)
    for i, r in enumerate(v.tables(doc, "router")):
        cfg.routers.append(_router(r, f"router[{i}]", i, cfg))
    for i, w in enumerate(v.tables(doc, "worker")):
        cfg.workers.append(_worker(w, f"worker[{i}]", i, cfg))
    otlp = v.table(doc, "otlp")
    cfg.otlp_host = v.text(otlp, "host", "otlp") or cfg.otlp_host
    for key in ("grpc_port", "http_port"):
        setattr(cfg, f"otlp_{key}", v.integer(otlp, key, "otlp.", None, 0, 65535))
    demo = v.table(doc, "demo")
    ready = v.text(demo, "ready_file", "demo")
    cfg.ready_file = v.confined(ready, "demo.ready_file", base_dir, cfg.log_dirs)
    cfg.demo_kv_transport = v.choice(demo, "kv_transport", "demo.", "zmq", ("zmq", "grpc"))
    return cfg


def _router(r: Any, where: str, i: int, cfg: Config) -> RouterTarget:
    return RouterTarget(
        name=v.text(r, "name", where) or f"router{i}",
        kind=v.choice(r, "kind", f"{where}.", "auto", ("smg", "dynamo", "auto")),
        url=v.endpoint(v.text(r, "url", where, required=True), f"{where}.url", v.HTTP) or "",
        metrics_url=v.endpoint(v.text(r, "metrics_url", where), f"{where}.metrics_url",
                               v.HTTP),
        api_key_env=v.text(r, "api_key_env", where),
        discover_workers=v.flag(r, "discover_workers", f"{where}.", True),
        indexer_url=v.endpoint(v.text(r, "indexer_url", where), f"{where}.indexer_url",
                               v.HTTP),
        event_plane=_event_plane(r, where),
        namespace=v.text(r, "namespace", where) or "*",
        media_origin=v.endpoint(v.text(r, "media_origin", where), f"{where}.media_origin",
                                v.HTTP),
        log_file=v.confined(v.text(r, "log_file", where), f"{where}.log_file", cfg.base_dir,
                            cfg.log_dirs))


def _worker(w: Any, where: str, i: int, cfg: Config) -> WorkerTarget:
    dp = v.integer(w, "dp_size", f"{where}.", 1, 1, 1024) or 1
    kv = v.text(w, "kv_events", where)
    return WorkerTarget(
        name=v.text(w, "name", where) or f"worker{i}",
        engine=v.choice(w, "engine", f"{where}.", "vllm", ("vllm", "sglang")),
        router_url=v.text(w, "router_url", where),
        metrics_url=v.endpoint(v.text(w, "metrics_url", where), f"{where}.metrics_url",
                               v.HTTP),
        kv_events=v.endpoint(kv, f"{where}.kv_events", v.ZMQ + v.GRPC, dp - 1),
        kv_replay=v.endpoint(v.text(w, "kv_replay", where), f"{where}.kv_replay", v.ZMQ,
                             dp - 1),
        dp_size=dp, topic=v.text(w, "topic", where) or "",
        log_file=v.confined(v.text(w, "log_file", where), f"{where}.log_file", cfg.base_dir,
                            cfg.log_dirs),
        model=v.text(w, "model", where))


def _event_plane(table: Any, where: str) -> str | None:
    """nats://host:port, or tcp://host:port = Dynamo's ZMQ broker (its xpub side)."""
    return v.endpoint(v.text(table, "event_plane", where), f"{where}.event_plane",
                      ("nats", "tls", "tcp"))


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    path = path or os.environ.get(ENV_CONFIG)
    if not path:
        raise ConfigError(f"no config: pass --config or set {ENV_CONFIG}")
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # TOML, UTF-8 and nesting errors
        raise ConfigError(f"{p}: {exc}") from None
    return parse_config(doc, p.parent)


def apply_ready(cfg: Config, ready: Any, ready_dir: Path | None = None) -> list[str]:
    """Add the demo's routers and workers from its ready line (``{"event":"ready", …}``).
    Read from a file (``ready_dir`` given), a router log it names must lie in that file's
    directory, in the config's ``log_dirs`` or in the demo's own log folder (``logs``); a
    caller that got the line from a demo it started itself passes no ``ready_dir`` and vouches
    for its paths. Nothing is added
    unless the whole line is valid; a log outside the allowed directories is left out and
    said in the returned notes (the router is still added)."""
    if not isinstance(ready, dict) or ready.get("event") != "ready":
        raise ConfigError("not a demo ready line")
    if ready.get("routers") is not None:
        routers = v.tables(ready, "routers", 64)
    elif ready.get("router") is not None:
        routers = [{"name": "demo", "url": ready["router"], "metrics": ready.get("router_metrics"),
                    "log": ready.get("router_log")}]
    else:
        routers = []
    kind = v.choice(ready, "router_kind", "ready file ", "smg", ("smg", "dynamo", "auto"))
    plane = _event_plane(ready, "ready file")
    origin = v.endpoint(v.text(ready, "media_origin", "ready file"), "ready file media_origin",
                        v.HTTP)
    notes: list[str] = []
    # A demo writes its ready file wherever asked and its logs to its own folder, which the
    # line names ("logs"): router logs inside that folder are the demo's own.
    allowed = list(cfg.log_dirs)
    demo_logs = ready.get("logs")
    if isinstance(demo_logs, str) and Path(demo_logs).is_absolute() and Path(demo_logs).is_dir():
        allowed.append(Path(demo_logs).resolve())
    new_routers = [_ready_router(r, f"routers[{i}]", kind, plane, ready_dir, allowed, notes)
                   for i, r in enumerate(routers)]
    for r in new_routers:
        r.media_origin = origin
    grpc = cfg.demo_kv_transport == "grpc"
    new_workers = [_ready_worker(w, f"workers[{i}]", grpc)
                   for i, w in enumerate(v.tables(ready, "workers", 4096))]
    for r in new_routers:
        if not any(t.url == r.url for t in cfg.routers):
            cfg.routers.append(r)
    for w in new_workers:
        cfg.add_worker(w)
    return notes


def _ready_router(r: Any, where: str, kind: str, plane: str | None, base: Path | None,
                  log_dirs: list[Path], notes: list[str]) -> RouterTarget:
    log = v.text(r, "log", where)
    if base is not None:
        try:
            log = v.confined(log, f"{where}.log", base, log_dirs)
        except ConfigError as exc:
            notes.append(str(exc))
            log = None
    return RouterTarget(
        name=v.text(r, "name", where) or "demo", kind=kind,
        url=v.endpoint(v.text(r, "url", where, required=True), f"{where}.url", v.HTTP) or "",
        metrics_url=v.endpoint(v.text(r, "metrics", where), f"{where}.metrics", v.HTTP),
        log_file=log,
        event_plane=plane)


def _ready_worker(w: Any, where: str, grpc: bool) -> WorkerTarget:
    dp = v.integer(w, "dp_size", f"{where}.", 1, 1, 1024) or 1
    for key in ("url", "grpc", "http", "metrics", "kv_events", "kv_grpc", "kv_replay",
                "kv_topic", "name", "engine", "model"):
        v.text(w, key, where)
    wid = w.get("worker_id")  # Dynamo's decimal id, as a number or a string of digits
    if wid is not None and not (type(wid) is int or (
            isinstance(wid, str) and wid.isdigit() and len(wid) <= 20)):
        raise ConfigError(f"{where}.worker_id: expected a decimal worker id, got {wid!r:.60}")
    use_grpc = grpc and bool(w.get("kv_grpc"))
    return WorkerTarget(
        name=str(w.get("name")), engine=v.choice(w, "engine", f"{where}.", "vllm",
                                                 ("vllm", "sglang")),
        # SMG names a worker by its URL, Dynamo by its decimal worker id.
        router_url=w.get("url") or w.get("grpc") or w.get("http") or (
            None if wid is None else str(wid)),
        metrics_url=v.endpoint(w.get("metrics"), f"{where}.metrics", v.HTTP),
        kv_events=v.endpoint(w.get("kv_grpc") if use_grpc else w.get("kv_events"),
                             f"{where}.kv_events", v.ZMQ + v.GRPC, dp - 1),
        kv_replay=None if use_grpc else v.endpoint(w.get("kv_replay"), f"{where}.kv_replay",
                                                   v.ZMQ, dp - 1),
        dp_size=dp, topic=w.get("kv_topic") or "", model=w.get("model"))


MAX_READY_BYTES = 1 << 20


def read_ready_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ready line of a ready file (pretty-printed JSON, or the last ready line of a log);
    ConfigError for a missing, oversized, undecodable file or one without a ready line."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_READY_BYTES + 1)
        text = raw.decode("utf-8").strip()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"ready file {path}: {exc}") from None
    if len(raw) > MAX_READY_BYTES:
        raise ConfigError(f"ready file {path}: larger than {MAX_READY_BYTES} bytes")
    for candidate in [text, *reversed(text.splitlines())]:
        candidate = candidate.strip()
        if not candidate.startswith("{"):
            continue
        try:
            obj = json.loads(candidate)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and obj.get("event") == "ready":
            return obj
    raise ConfigError(f"ready file {path}: no ready line")


def smg_worker_target(url: str, labels: dict[str, str]) -> WorkerTarget:
    """A worker discovered from SMG ``/workers``: the router's name for it, nothing to scrape
    unless its labels say where (SMG reports neither a metrics nor a KV-event endpoint)."""
    return WorkerTarget(name=url, engine=labels.get("runtime_type", "vllm") if labels.get(
        "runtime_type") in ("vllm", "sglang") else "vllm", router_url=url)
