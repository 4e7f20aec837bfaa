"""``mmlens collect``: run all collectors headless into the store."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import httpx

from mmlens.cli.buffer_options import add_buffer_options
from mmlens.cli.gc_tuning import tune_gc
from mmlens.collectors.config_reload import ConfigWatcher, reload_if_changed
from mmlens.collectors.log_follow import LogFollower, StreamFollower
from mmlens.collectors.metrics_export import MetricsServer, StoreExport
from mmlens.collectors.runner import CollectorRunner
from mmlens.collectors.trace_sink import TraceSink
from mmlens.collectors.traces import ImagePart, TraceClient, solid_png
from mmlens.config import (
    ENV_CONFIG,
    Config,
    ConfigError,
    apply_ready,
    load_config,
    read_ready_file,
)
from mmlens.export.families import Part
from mmlens.shard import ShardError, parse_shard
from mmlens.store.open import StoreError, open_store

# Two images with the same size (same N, different identity) and one other size: repeats of
# each show cache hits; red vs blue show SMG's content-blind routing.
_WORKLOAD_IMAGES = ((64, 64, (200, 30, 30)), (64, 64, (30, 30, 200)), (224, 224, (30, 160, 30)))


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="mmlens collect", description=__doc__)
    ap.add_argument("--config", help="mmlens.toml (default: $MMLENS_CONFIG)")
    ap.add_argument("--db", required=True, help="store: a SQLite file (created if missing) or "
                    "a postgresql://… URL")
    ap.add_argument("--duration", type=float, help="stop after S seconds (default: run on)")
    ap.add_argument("--interval", type=float, help="override interval_s")
    ap.add_argument("--ready-file", help="add targets from a `mmlens demo --ready-file` file")
    ap.add_argument("--kv-transport", choices=["zmq", "grpc"],
                    help="demo workers: read their KV events over ZMQ or their SubscribeKvEvents "
                         "gRPC stream (default: [demo] kv_transport, else zmq)")
    ap.add_argument("--router-log", action="append", default=[],
                    help="[NAME=]PATH of a router JSON log to follow; PATH - reads stdin")
    ap.add_argument("--otlp-grpc-port", type=int,
                    help="run the OTLP trace receiver's gRPC listener on this port (0: any)")
    ap.add_argument("--otlp-http-port", type=int,
                    help="run the OTLP receiver's HTTP/protobuf listener (POST /v1/traces)")
    ap.add_argument("--workload", type=int, default=0,
                    help="send N traced image requests through the first router")
    ap.add_argument("--model", help="model for --workload (default: router's first model)")
    ap.add_argument("--layout-model", help="family or model dir for expected layouts")
    ap.add_argument("--shard", help="I/N: collect only the workers of shard I of N (N "
                    "collectors split the workers by a stable hash; shard 0 also collects the "
                    "routers)")
    ap.add_argument("--metrics-port", type=int,
                    help="serve Prometheus metrics of the store on this port (0: any free one)")
    ap.add_argument("--metrics-host", default="127.0.0.1",
                    help="address of the --metrics-port listener (default 127.0.0.1)")
    add_buffer_options(ap)
    ap.add_argument("-v", "--verbose", action="store_true")
    return ap.parse_args(list(argv))


def run_workload(runner: CollectorRunner, client: httpx.Client, n: int, model: str | None,
                 layout_model: str | None) -> None:
    if not runner.cfg.routers:
        return
    router = runner.cfg.routers[0]
    if model is None:
        states = runner.store.meta("router_state") or [runner.router_state.poll(router)]
        models = states[0].get("models") or [] if states else []
        model = models[0] if models else "default"
    # The runner's store, written on this (the runner's) thread.
    tracer = TraceClient(client, sink=TraceSink(runner.store.add_traces,
                                                layout_model=layout_model))
    images = [solid_png(w, h, rgb) for w, h, rgb in _WORKLOAD_IMAGES]
    for i in range(n):
        img = images[(i // 2) % len(images)]
        tracer.send(router.url, model, "Describe this image in detail please.",
                    [ImagePart(img)], router_kind=router.kind, stream=i % 3 == 2,
                    api_key=router.api_key())


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        shard = parse_shard(args.shard) if args.shard else None
        cfg = load_config(args.config) if (args.config or not args.ready_file) else Config()
    except (ConfigError, ShardError) as exc:
        print(f"mmlens collect: {exc}", file=sys.stderr)
        return 2
    if args.ready_file:
        cfg.ready_file = args.ready_file
    if cfg.ready_file:  # a bad ready file is the same clear exit 2 as a bad config
        try:
            for note in apply_ready(Config(base_dir=cfg.base_dir, log_dirs=cfg.log_dirs,
                                           demo_kv_transport=cfg.demo_kv_transport),
                                    read_ready_file(cfg.ready_file),
                                    Path(cfg.ready_file).parent):
                print(f"mmlens collect: warning: {note}", file=sys.stderr)
        except ConfigError as exc:
            print(f"mmlens collect: {exc}", file=sys.stderr)
            return 2
    if args.kv_transport:
        cfg.demo_kv_transport = args.kv_transport
    if args.interval:
        cfg.interval_s = args.interval
    if args.otlp_grpc_port is not None:
        cfg.otlp_grpc_port = args.otlp_grpc_port
    if args.otlp_http_port is not None:
        cfg.otlp_http_port = args.otlp_http_port
    try:
        store = open_store(args.db)
    except (StoreError, OSError) as exc:
        print(f"mmlens collect: {exc}", file=sys.stderr)
        return 2
    streams: dict[str, LogFollower | StreamFollower] = {}
    for spec in args.router_log:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = "router-log", spec
        streams[name] = StreamFollower(sys.stdin) if path == "-" else LogFollower(path)
    client = httpx.Client()
    runner = CollectorRunner(cfg, store, http=client, log_streams=streams,
                             prom=_prometheus(cfg), shard=shard, spill_dir=args.spill_dir,
                             buffer_records=args.buffer_records)
    try:
        metrics = _metrics_server(args, runner)
    except OSError as exc:
        print(f"mmlens collect: --metrics-port {args.metrics_port}: {exc}", file=sys.stderr)
        store.close()
        client.close()
        return 2
    tune_gc()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    workload_done = threading.Event()

    config_file = args.config or os.environ.get(ENV_CONFIG)
    watcher = ConfigWatcher(config_file) if config_file and not args.ready_file else None

    def on_tick(r: CollectorRunner) -> None:
        if args.workload and r.leads and not workload_done.is_set():
            workload_done.set()
            run_workload(r, client, args.workload, args.model, args.layout_model)
        for note in reload_if_changed(r, watcher) if watcher else []:
            print(f"mmlens collect: {note}", file=sys.stderr, flush=True)

    try:
        runner.run(args.duration, stop, on_tick)
    finally:
        if metrics is not None:
            metrics.close()
        store.close()
        client.close()
    return 0


def _metrics_server(args: argparse.Namespace, runner: CollectorRunner) -> MetricsServer | None:
    """The Prometheus endpoint: this process's part of the store (its shard's workers, its
    own health rows)."""
    if args.metrics_port is None:
        return None
    export = StoreExport(args.db, Part(runner.shard), instance=runner.instance)
    server = MetricsServer(export, args.metrics_host, args.metrics_port)
    print(f"mmlens collect: metrics on {server.url}", file=sys.stderr, flush=True)
    return server


def _prometheus(cfg: Config) -> object | None:
    if not cfg.prometheus_url:
        return None
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    # One quick retry: the client's default backs off for seconds, stalling every tick.
    return PrometheusConnect(url=cfg.prometheus_url, disable_ssl=True,
                             retry=Retry(total=1, backoff_factor=0.1))
