"""``mmlens tap --listen 127.0.0.1:PORT --upstream ROUTER_URL --db PATH``: a streaming
reverse proxy in front of a router; clients point at the tap instead of the router, the tap
passes everything through unchanged and records each request into the store.

Privacy by default: image sizes and hashes and token counts, never prompt text or image
bytes (``--store-text`` keeps the text). ``--sample 0.1`` records one request in ten (all
are proxied). ``--layout-model`` (a family or a model directory) adds the expected token
layout, so the explainer can compare requests by content. ``--dynamo-worker-id`` asks a
Dynamo frontend for the worker id and timing on every request (Dynamo 1.6.1 names the worker
only when asked) and removes them from answers that did not ask."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from mmlens.cli.buffer_options import add_buffer_options
from mmlens.cli.gc_tuning import RECORDER_THRESHOLDS, tune_gc
from mmlens.cli.heap_tuning import keep_heap
from mmlens.cli.sched_tuning import SLICE_NS, set_slice
from mmlens.collectors.store_buffer import BufferedStore
from mmlens.collectors.tap import MAX_RECORD_BODY, Tap
from mmlens.collectors.tap_images import MAX_IMAGE_BYTES, ImageFetcher
from mmlens.collectors.tap_process import PRIORITIES, RecorderProcess
from mmlens.collectors.tap_record import LayoutFn, Recorder
from mmlens.collectors.trace_sink import TraceSink
from mmlens.ingest.tap_parse import RequestFacts
from mmlens.records import CollectorHealth, LayoutPart, RequestTrace
from mmlens.store.open import StoreError, open_store


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="mmlens tap", description=__doc__)
    ap.add_argument("--listen", default="127.0.0.1:30080", help="HOST:PORT to serve on")
    ap.add_argument("--upstream", required=True, help="the router's URL")
    ap.add_argument("--db", required=True, help="store to record into (SQLite file or "
                    "postgresql://… URL)")
    ap.add_argument("--sample", type=float, default=1.0, help="fraction of requests recorded")
    ap.add_argument("--store-text", action="store_true", help="also store prompt text")
    ap.add_argument("--layout-model", help="family or model dir for expected token layouts")
    ap.add_argument("--max-record-body", type=int, default=MAX_RECORD_BODY,
                    help="request bodies larger than this are proxied but not recorded")
    ap.add_argument("--fetch-images", action="store_true",
                    help="fetch images sent by http(s) URL (after the response went back) to "
                    "record their size and content identities; bytes are never stored")
    ap.add_argument("--fetch-host", action="append", default=[], metavar="HOST[:PORT]",
                    help="with --fetch-images: fetch only from these hosts, whatever their "
                    "address (repeatable; default: any host with a public address)")
    ap.add_argument("--fetch-allow-private", action="store_true",
                    help="with --fetch-images and no --fetch-host: also fetch from private, "
                    "loopback and link-local addresses")
    ap.add_argument("--fetch-max-bytes", type=int, default=MAX_IMAGE_BYTES,
                    help="with --fetch-images: larger images are not fetched")
    ap.add_argument("--fetch-timeout", type=float, default=5.0,
                    help="with --fetch-images: seconds one fetch may take")
    ap.add_argument("--dynamo-worker-id", action="store_true",
                    help="ask a Dynamo frontend for nvext.worker_id and timing on requests "
                    "that did not, and remove them from the answer the client gets")
    add_buffer_options(ap)
    ap.add_argument("--recorder", choices=("process", "thread"), default="process",
                    help="where records are made: a process of its own (the proxy never "
                    "waits for it), or a thread of the proxy's process (less CPU per record)")
    ap.add_argument("--recorder-priority", choices=PRIORITIES, default="idle",
                    help="the recorder process's scheduling: idle (it runs only on CPU "
                    "nothing else wants: the proxy never waits behind it) or low (nice 10: a "
                    "share of a busy core, for hosts whose every core is busy)")
    args = ap.parse_args(list(argv))
    if not 0.0 <= args.sample <= 1.0:
        ap.error("--sample must be between 0 and 1")
    if args.fetch_max_bytes <= 0 or not 0 < args.fetch_timeout <= 300:
        ap.error("--fetch-max-bytes must be positive and --fetch-timeout within (0, 300] s")
    return args


def layout_fn(layout_model: str, store_text: bool) -> LayoutFn:
    sink = TraceSink(layout_model=layout_model)

    def fn(req: RequestFacts, t: RequestTrace) -> None:
        images = req.sent_images()
        if images is None:
            return  # an http image's size is unknown unless the tap fetched it
        lay = sink.layout(req.text, images)
        if lay is None:
            return
        lay.parts = [LayoutPart(**p) for p in req.parts]
        if store_text:
            lay.text = req.text
        t.expected_layout = lay

    return fn


def recorder_setup(args: argparse.Namespace, health: CollectorHealth,
                   ) -> tuple[Callable[[list[RequestTrace]], int], dict[str, Any]]:
    """In the recorder's process: the store it writes (through the outage buffer the
    collector uses) and the recorder's options; the process's collector tuned for records
    (parsing allocates thousands of short-lived dicts a second, a batch lives till written;
    with ``--recorder thread`` the proxy's tuning follows)."""
    keep_heap()
    buffer = BufferedStore(open_store(args.db), args.spill_dir, max_memory=args.buffer_records)
    outage_instance = f"tap {socket.gethostname()}:{os.getpid()}"
    # The recorder writes to the buffer itself: it says how many the store took (fewer: it
    # left some out, or held them), and the store merges records that share a key, in the
    # batch and with stored rows.
    write = buffer.add_traces

    def flush_health(row: CollectorHealth) -> None:
        buffer.set_health([row])
        buffer.set_health([buffer.outage_health], instance=outage_instance)

    fetcher = ImageFetcher(health, frozenset(h.lower() for h in args.fetch_host) or None,
                           args.fetch_max_bytes, args.fetch_timeout,
                           allow_private=args.fetch_allow_private) if args.fetch_images \
        else None
    tune_gc(RECORDER_THRESHOLDS)
    return write, {"router": args.upstream, "store_text": args.store_text,
                   "layout": layout_fn(args.layout_model, args.store_text)
                   if args.layout_model else None, "fetcher": fetcher,
                   "flush_health": flush_health, "buffer": buffer}


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    keep_heap()
    host, _, port = args.listen.rpartition(":")
    try:
        open_store(args.db).close()  # created (or refused) before anything listens
    except (StoreError, OSError) as exc:
        print(f"mmlens tap: {exc}", file=sys.stderr)
        return 2
    health = CollectorHealth("tap", args.upstream)
    recorder: RecorderProcess | Recorder
    if args.recorder == "process":
        recorder = RecorderProcess(functools.partial(recorder_setup, args), health,
                                   priority=args.recorder_priority)
    else:
        write, options = recorder_setup(args, health)
        recorder = Recorder(write, health, **options)
    tap = Tap(args.upstream, recorder.submit, sample=args.sample,
              max_record_body=args.max_record_body, health=health,
              dynamo_worker_id=args.dynamo_worker_id)
    tune_gc()
    # The loop's thread only: the recorder process and the health thread, started above,
    # keep the kernel's default slice.
    set_slice(SLICE_NS)
    try:
        run_loop(serve(tap, host or "127.0.0.1", int(port), args.upstream))
    except OSError as exc:
        print(f"mmlens tap: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 2
    finally:
        recorder.close()
    return 0


async def serve(tap: Tap, host: str, port: int, upstream: str) -> None:
    """Serve until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await tap.serve(host, port)
    print(json.dumps({"event": "tap_ready", "listen": f"{host}:{port}",
                      "upstream": upstream}), flush=True)
    try:
        await stop.wait()
    finally:
        await tap.close()


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """uvloop when installed (the proxy's per-request cost is mostly the loop's), else
    asyncio's own."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)
