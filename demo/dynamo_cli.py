"""`mmlens demo --router dynamo`: the real Dynamo frontend in front of simulated vLLM workers.

Prints one JSON line `{"event": "ready", "router_kind": "dynamo", ...}` when the frontend
lists the model and has registered every worker; Ctrl-C or SIGTERM stops every process it
started and removes the demo's scratch folder.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from mmlens.demo.cli import add_media_host, count_drift, serve
from mmlens.demo.dynamo_cluster import (
    DynamoCluster,
    DynamoClusterConfig,
    dynamo_available,
    infra_missing,
)
from mmlens.demo.model_dirs import MODELS


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmlens demo --router dynamo", description=__doc__)
    p.add_argument("--router", choices=["dynamo"], default="dynamo")
    p.add_argument("--model", choices=sorted(MODELS), default="qwen3-vl",
                   help="demo model family (default qwen3-vl; Dynamo 1.6.1 routes images "
                        "exactly for Qwen3-VL and Kimi-K3, on the text prefix only for GLM)")
    p.add_argument("--workers", type=int, default=2, help="simulated workers (default 2)")
    p.add_argument("--port-base", type=int, default=18500,
                   help="frontend on BASE, broker BASE+2/+3, media origin BASE+7, worker i "
                        "on BASE+10+10i.. (default 18500)")
    p.add_argument("--no-router-kv-events", action="store_true",
                   help="approximate mode: the router predicts cache state from its own "
                        "decisions; workers publish no KV events to Dynamo")
    p.add_argument("--tokenizer", choices=["default", "fastokens", "basetenkenizer"],
                   help="frontend tokenizer backend (default: basetenkenizer for kimi-k3, "
                        "which Dynamo needs for exact Kimi-K3 routing; else Dynamo's default)")
    p.add_argument("--count-drift", default="0",
                   help="add N to the workers' image-token count; one value or one per worker")
    p.add_argument("--block-size", type=int, default=16,
                   help="KV block size the workers register (the frontend reads it)")
    p.add_argument("--num-blocks", type=int, default=4096, help="KV blocks per worker")
    p.add_argument("--speed", type=float, default=1.0, help="worker latency divisor")
    p.add_argument("--kv-path", choices=["pad", "vllm-zmq"], default="pad",
                   help="pad: workers push pad-value KV events through Dynamo's publisher "
                        "(default); vllm-zmq: Dynamo relays the workers' raw vLLM-format ZMQ "
                        "events and rewrites image runs itself, as with real vLLM workers")
    p.add_argument("--event-plane", choices=["zmq", "nats"], default="zmq",
                   help="zmq: file discovery and a loopback ZMQ broker (default); nats: "
                        "production shape, etcd discovery and the NATS event plane with the "
                        "demo's own etcd and nats-server (apt-get install etcd-server "
                        "nats-server), all on 127.0.0.1")
    add_media_host(p)
    p.add_argument("--no-zmq-kv-events", action="store_true",
                   help="workers do not also publish vLLM-format ZMQ KV events for mmlens")
    p.add_argument("--ready-file", type=Path, help="also write the ready JSON here")
    p.add_argument("--log-dir", type=Path,
                   help="process logs (default: a temporary dir, removed at exit)")
    p.add_argument("--model-cache", type=Path, help="where model directories are generated")
    p.add_argument("--ready-timeout", type=float, default=40.0)
    return p.parse_args(list(argv))


def config_from(args: argparse.Namespace) -> DynamoClusterConfig:
    return DynamoClusterConfig(
        family=args.model, workers=args.workers, port_base=args.port_base,
        router_kv_events=not args.no_router_kv_events, count_drift=count_drift(args),
        block_size=args.block_size, num_blocks=args.num_blocks, speed=args.speed,
        zmq_kv_events=not args.no_zmq_kv_events, kv_path=args.kv_path,
        tokenizer_backend=args.tokenizer, event_plane=args.event_plane,
        media_hosts=args.media_host, log_dir=args.log_dir,
        model_cache=args.model_cache, ready_timeout=args.ready_timeout)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    if args.workers < 1:
        print("mmlens demo: --workers must be at least 1", file=sys.stderr)
        return 2
    reason = dynamo_available() or (infra_missing() if args.event_plane == "nats" else None)
    if reason:
        print(f"mmlens demo: {reason}", file=sys.stderr)
        return 2
    return serve(lambda: DynamoCluster(config_from(args)), args.ready_file)
