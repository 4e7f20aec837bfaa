"""`mmlens demo`: the real SMG router in front of simulated vLLM workers, all on 127.0.0.1.

Prints one JSON line `{"event": "ready", ...}` when the router has registered every worker
(and, in gRPC mode, every worker's KV-event stream is live); Ctrl-C or SIGTERM stops every
process it started, giving SMG its drain.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from mmlens.demo.cluster import Cluster, ClusterConfig
from mmlens.demo.media_origin import media_host
from mmlens.demo.model_dirs import MODELS
from mmlens.demo.procs import ClusterError, Proc, write_ready

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class DemoCluster(Protocol):
    """What `serve` runs: the SMG `Cluster` or the `DynamoCluster`."""

    procs: list[Proc]

    def start(self) -> dict[str, Any]: ...

    def stop(self) -> None: ...


def _router_procs(cluster: DemoCluster) -> set[int]:
    """PIDs of the cluster's routers (a router that exits leaves the workers running)."""
    return {p.popen.pid for p in getattr(cluster, "router_procs", [])}


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmlens demo", description=__doc__)
    p.add_argument("--router", choices=["smg", "dynamo"], default="smg",
                   help="real router in front of the workers (default smg; for dynamo's own "
                        "options see `mmlens demo --router dynamo --help`)")
    p.add_argument("--model", choices=sorted(MODELS), default="qwen3-vl",
                   help="demo model family (default qwen3-vl)")
    p.add_argument("--workers", type=int, default=2, help="simulated workers (default 2)")
    p.add_argument("--engine", choices=["vllm", "sglang", "vllm,sglang", "sglang,vllm"],
                   default="vllm",
                   help="simulated workers speak vLLM's or SGLang's wire protocols (gRPC "
                        "service, metric names, KV-event encoding), or alternate per worker "
                        "(vllm,sglang); default vllm")
    p.add_argument("--connection", choices=["grpc", "http"], default="grpc",
                   help="how SMG talks to the workers (default grpc)")
    p.add_argument("--port-base", type=int, default=18400,
                   help="router on BASE, metrics BASE+1, media origin BASE+7, worker i on "
                        "BASE+10+10i.. (default 18400)")
    p.add_argument("--mm-processing", choices=["auto", "router", "worker"],
                   help="SMG --mm-processing (default: SMG's own, auto)")
    p.add_argument("--worker-processing", action="store_true",
                   help="workers advertise mm_processor=inprocess (SMG may forward media_refs)")
    p.add_argument("--worker-mode-router", action="store_true",
                   help="also start a second SMG over the same workers with --mm-processing "
                        "worker (API BASE+2, metrics BASE+3); the first runs --mm-processing "
                        "router, the workers advertise mm_processor")
    p.add_argument("--count-drift", default="0",
                   help="add N to the workers' image-token count; one value or one per worker "
                        "(e.g. 0,3)")
    p.add_argument("--legacy-kv-encoding", action="store_true",
                   help="ZMQ KV events as positional arrays (vLLM before PR #42892)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=2048, help="KV blocks per worker")
    p.add_argument("--speed", type=float, default=1.0, help="worker latency divisor")
    p.add_argument("--max-image-bytes", type=int, help="workers refuse larger images")
    add_media_host(p)
    p.add_argument("--ready-file", type=Path, help="also write the ready JSON here")
    p.add_argument("--log-dir", type=Path,
                   help="keep process logs here (default: a temporary dir removed at exit)")
    p.add_argument("--model-cache", type=Path, help="where model directories are generated")
    p.add_argument("--ready-timeout", type=float, default=60.0)
    p.add_argument("--smg-log-level", default="debug", choices=["debug", "info", "warn", "error"])
    return p.parse_args(list(argv))


def _media_host_arg(value: str) -> str:
    try:
        return media_host(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_media_host(p: argparse.ArgumentParser) -> None:
    p.add_argument("--media-host", action="append", default=[], type=_media_host_arg,
                   metavar="HOST:PORT",
                   help="the workers may also fetch image URLs from HOST:PORT (repeatable; "
                        "HOST:* opens every port of HOST); by default they fetch only from the "
                        "demo's own media origin, BASE+7 (media_origin in the ready line)")


def count_drift(args: argparse.Namespace) -> list[int]:
    """`--count-drift`: one value for every worker, or one per worker."""
    drift = [int(v) for v in str(args.count_drift).split(",") if v.strip()]
    return drift * args.workers if len(drift) == 1 else drift


def config_from(args: argparse.Namespace) -> ClusterConfig:
    return ClusterConfig(
        family=args.model, workers=args.workers, connection=args.connection,
        engine=args.engine,
        port_base=args.port_base, mm_processing=args.mm_processing,
        worker_mm_processor=args.worker_processing, count_drift=count_drift(args),
        legacy_kv_encoding=args.legacy_kv_encoding, block_size=args.block_size,
        num_blocks=args.num_blocks, speed=args.speed,
        max_image_bytes=args.max_image_bytes, media_hosts=args.media_host,
        log_dir=args.log_dir,
        model_cache=args.model_cache, ready_timeout=args.ready_timeout,
        smg_log_level=args.smg_log_level, worker_mode_router=args.worker_mode_router)


def _router_of(argv: Sequence[str]) -> str:
    for i, arg in enumerate(argv):
        if arg == "--router" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--router="):
            return arg.split("=", 1)[1]
    return "smg"


def serve(make_cluster: Callable[[], DemoCluster], ready_file: Path | None, *,
          signals: Sequence[signal.Signals] = STOP_SIGNALS, watch_parent: bool = True) -> int:
    """Start the cluster, print its ready line (and write `ready_file`), and run until one of
    `signals`, the exit of one of its workers or (`watch_parent`) of our parent; then stop
    everything, remove `ready_file` and print the stopped line. A router that exits (killed,
    crashed) is reported once and leaves the workers serving, so a dashboard on the demo shows
    the router down instead of losing everything. Returns the exit code."""
    # Set explicitly: a background launch may have inherited SIGINT as ignored.
    for sig in signals:
        signal.signal(sig, _raise_stop)
    parent = os.getppid()
    cluster = make_cluster()
    t0 = time.monotonic()
    code = 0
    try:
        info = cluster.start()
        info["startup_seconds"] = round(time.monotonic() - t0, 2)
        if ready_file:
            write_ready(ready_file, info)
        print(json.dumps(info), flush=True)
        routers = _router_procs(cluster)
        reported: set[str] = set()
        while True:
            time.sleep(0.5)
            if watch_parent and os.getppid() != parent:  # do not outlive whoever started us
                print("mmlens demo: parent process exited; stopping", file=sys.stderr)
                break
            exited = [p for p in cluster.procs if p.popen.poll() is not None]
            for p in exited:
                if p.popen.pid in routers and p.name not in reported:
                    reported.add(p.name)
                    print(json.dumps({"event": "router_exited", "name": p.name,
                                      "code": p.popen.returncode}), flush=True)
            dead = [p.name for p in exited if p.popen.pid not in routers]
            if dead:
                print(f"mmlens demo: {', '.join(dead)} exited; stopping", file=sys.stderr)
                code = 1
                break
    except _Stop:
        pass
    except ClusterError as exc:
        print(f"mmlens demo: {exc}", file=sys.stderr)
        code = 1
    finally:
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        cluster.stop()
        if ready_file and ready_file.exists():
            ready_file.unlink()
        print(json.dumps({"event": "stopped"}), flush=True)
    return code


def main(argv: list[str]) -> int:
    if _router_of(argv) == "dynamo":
        from mmlens.demo.dynamo_cli import main as dynamo_main

        return dynamo_main(argv)
    args = parse_args(argv)
    if args.workers < 1:
        print("mmlens demo: --workers must be at least 1", file=sys.stderr)
        return 2
    return serve(lambda: Cluster(config_from(args)), args.ready_file)
