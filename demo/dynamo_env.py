"""The environment of the Dynamo demo's processes: loopback everywhere, a scratch HOME, the
Hub offline, JSON logs with the routing targets at debug; or etcd + NATS for the NATS plane."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from mmlens.demo.procs import HOST, with_repo_on_path

ROUTING_LOG_FILTER = ("info,mm_routing=debug,dynamo_kv_router::scheduling=debug,"
                      "dynamo_llm::kv_router=debug")


def infra_missing() -> str | None:
    """None when `etcd` and `nats-server` are installed, else what to install."""
    missing = [b for b in ("etcd", "nats-server") if shutil.which(b) is None]
    if not missing:
        return None
    return (f"{' and '.join(missing)} not found: the NATS event plane needs Debian's "
            "etcd-server and nats-server packages (apt-get install etcd-server nats-server)")


def nats_env(env: dict[str, str], etcd_port: int, nats_port: int) -> dict[str, str]:
    """`env` switched from file discovery + ZMQ broker to etcd + NATS on loopback."""
    env = dict(env)
    for key in ("DYN_ZMQ_BROKER_URL", "DYN_FILE_KV"):
        env.pop(key, None)
    env.update({"DYN_DISCOVERY_BACKEND": "etcd", "DYN_EVENT_PLANE": "nats",
                "ETCD_ENDPOINTS": f"http://{HOST}:{etcd_port}",
                "NATS_SERVER": f"nats://{HOST}:{nats_port}"})
    return env


def loopback_env(scratch: Path, broker: str, base: dict[str, str] | None = None,
                 ) -> dict[str, str]:
    """The environment every Dynamo process of the demo runs with."""
    env = dict(os.environ if base is None else base)
    home = scratch / "home"
    for d in (home / ".cache", home / "hf", scratch / "kv", scratch / "tmp"):
        d.mkdir(parents=True, exist_ok=True)
    env.update({
        "DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(scratch / "kv"),
        "DYN_REQUEST_PLANE": "tcp", "DYN_EVENT_PLANE": "zmq", "DYN_ZMQ_BROKER_URL": broker,
        "DYN_TCP_RPC_HOST": HOST, "DYN_TCP_RESPONSE_STREAM_HOST": HOST,
        "DYN_EVENT_PLANE_HOST": HOST, "DYN_SYSTEM_HOST": HOST,
        "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
        "HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "TMPDIR": str(scratch / "tmp"),
        "DYN_MM_ALLOW_INTERNAL": "1", "DYN_LOGGING_JSONL": "true", "DYN_LOG": ROUTING_LOG_FILTER,
        # A worker's SIGTERM waits this long after leaving discovery (Dynamo's default 5 s,
        # for routers still sending to it) before it drains; the demo stops its frontend
        # first, so nobody is left to send. Measured on 1.6.1: a worker stops in 0.7 s, not 5.1.
        "DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS": "0",
    })
    env.pop("DYN_SYSTEM_PORT", None)
    return with_repo_on_path(env)
