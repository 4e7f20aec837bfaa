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
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from demo.cluster import Cluster, ClusterConfig, ClusterError, write_ready
from demo.model_dirs import MODELS


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
    p.add_argument("--connection", choices=["grpc", "http"], default="grpc",
                   help="how SMG talks to the workers (default grpc)")
    p.add_argument("--port-base", type=int, default=18400,
                   help="router on BASE, metrics BASE+1, worker i on BASE+10+10i.. (default 18400)")
    p.add_argument("--mm-processing", choices=["auto", "router", "worker"],
                   help="SMG --mm-processing (default: SMG's own, auto)")
    p.add_argument("--worker-processing", action="store_true",
                   help="workers advertise mm_processor=inprocess (SMG may forward media_refs)")
    p.add_argument("--count-drift", default="0",
                   help="add N to the workers' image-token count; one value or one per worker "
                        "(e.g. 0,3)")
    p.add_argument("--legacy-kv-encoding", action="store_true",
                   help="ZMQ KV events as positional arrays (vLLM before PR #42892)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=2048, help="KV blocks per worker")
    p.add_argument("--speed", type=float, default=1.0, help="worker latency divisor")
    p.add_argument("--max-image-bytes", type=int, help="workers refuse larger images")
    p.add_argument("--ready-file", type=Path, help="also write the ready JSON here")
    p.add_argument("--log-dir", type=Path,
                   help="keep process logs here (default: a temporary dir removed at exit)")
    p.add_argument("--model-cache", type=Path, help="where model directories are generated")
    p.add_argument("--ready-timeout", type=float, default=20.0)
    p.add_argument("--smg-log-level", default="debug", choices=["debug", "info", "warn", "error"])
    return p.parse_args(list(argv))


def config_from(args: argparse.Namespace) -> ClusterConfig:
    drift = [int(v) for v in str(args.count_drift).split(",") if v.strip()]
    if len(drift) == 1:
        drift = drift * args.workers
    return ClusterConfig(
        family=args.model, workers=args.workers, connection=args.connection,
        port_base=args.port_base, mm_processing=args.mm_processing,
        worker_mm_processor=args.worker_processing, count_drift=drift,
        legacy_kv_encoding=args.legacy_kv_encoding, block_size=args.block_size,
        num_blocks=args.num_blocks, speed=args.speed,
        max_image_bytes=args.max_image_bytes, log_dir=args.log_dir,
        model_cache=args.model_cache, ready_timeout=args.ready_timeout,
        smg_log_level=args.smg_log_level)


def _router_of(argv: Sequence[str]) -> str:
    for i, arg in enumerate(argv):
        if arg == "--router" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--router="):
            return arg.split("=", 1)[1]
    return "smg"


def main(argv: list[str]) -> int:
    if _router_of(argv) == "dynamo":
        from demo.dynamo_cli import main as dynamo_main

        return dynamo_main(argv)
    args = parse_args(argv)
    if args.workers < 1:
        print("mmlens demo: --workers must be at least 1", file=sys.stderr)
        return 2
    # Set explicitly: a background launch may have inherited SIGINT as ignored.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_stop)
    parent = os.getppid()
    cluster = Cluster(config_from(args))
    t0 = time.monotonic()
    code = 0
    try:
        info = cluster.start()
        info["startup_seconds"] = round(time.monotonic() - t0, 2)
        if args.ready_file:
            write_ready(args.ready_file, info)
        print(json.dumps(info), flush=True)
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:  # whoever started us is gone: do not outlive it
                print("mmlens demo: parent process exited; stopping", file=sys.stderr)
                break
            dead = [p.name for p in cluster.procs if p.popen.poll() is not None]
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
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        cluster.stop()
        if args.ready_file and args.ready_file.exists():
            args.ready_file.unlink()
        print(json.dumps({"event": "stopped"}), flush=True)
    return code
