"""`mmlens replay --db PATH --to URL [--since T] [--until T] [--speed X] [--concurrency N]`:
send a recorded window again, to a live OpenAI-compatible router, with its timing.

Each recorded request is sent at its recorded offset from the window's first (divided by
`--speed`), with at most `--concurrency` in flight: images of the recorded sizes whose bytes
follow from the recorded identities (a repeat is sent as the same bytes, a different image
as different bytes), the stored prompt text when the request was recorded with it, else
synthetic words of the recorded prompt length, and the recorded output length as
max_tokens. Prints what was sent, served and failed, the rate achieved against the rate
asked, and the replayed token-weighted hit rate beside the recording's. `--record-db`
stores the replayed requests' traces (e.g. for `mmlens whatif` or the dashboard).
Exit 0 when every request was served, 1 when some failed, 2 on setup errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence

import httpx

from mmlens.cli.window import add_window_args, window
from mmlens.collectors.replay_sender import Replayer
from mmlens.collectors.trace_sink import TraceSink, store_writer
from mmlens.errors import LayoutError
from mmlens.layout.modeldir import resolve_model
from mmlens.records import RequestTrace
from mmlens.replay.plan import plan
from mmlens.replay.text import TextFitter
from mmlens.store.open import StoreError
from mmlens.store.reader import open_reader
from mmlens.whatif.workload import workload


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmlens replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="the store holding the recorded window")
    add_window_args(p)
    p.add_argument("--to", required=True, metavar="URL", help="router to send to")
    p.add_argument("--speed", type=float, default=1.0,
                   help="timing scale: 2 sends twice as fast as recorded (default 1)")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight at most")
    p.add_argument("--model", help="model name to send (default: the recorded one)")
    p.add_argument("--layout-model",
                   help="family or model directory for the synthetic text's length (default: "
                        "the recorded layouts' family)")
    p.add_argument("--max-tokens", type=int, help="instead of the recorded output lengths")
    p.add_argument("--router-kind", choices=["auto", "smg", "dynamo"], default="auto")
    p.add_argument("--stream", action="store_true",
                   help="send every request streaming (default: as recorded)")
    p.add_argument("--record-db", help="store the replayed requests' traces here")
    p.add_argument("--limit", type=int, default=1_000_000, help="at most this many requests")
    p.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    p.add_argument("--dry-run", action="store_true", help="plan and print, send nothing")
    p.add_argument("--json", action="store_true")
    return p.parse_args(list(argv))


def _layout_model(traces: Sequence[RequestTrace]) -> tuple[str | None, int]:
    """The recorded layouts' most common family and block size."""
    seen = Counter((t.expected_layout.family, t.expected_layout.block_size) for t in traces
                   if t.expected_layout is not None and t.expected_layout.family)
    if not seen:
        return None, 16
    (family, block), _ = seen.most_common(1)[0]
    return family, block


def _stored_texts(traces: Sequence[RequestTrace]) -> dict[str, str]:
    return {t.request_id: t.expected_layout.text for t in traces
            if t.expected_layout is not None and t.expected_layout.text is not None}


def main(argv: Sequence[str], client: httpx.Client | None = None) -> int:
    """``client``: the HTTP client to send through (default a fresh one)."""
    args = parse_args(argv)
    if args.speed <= 0 or args.concurrency < 1:
        print("mmlens replay: --speed must be positive and --concurrency at least 1",
              file=sys.stderr)
        return 2
    try:
        reader = open_reader(args.db)
    except StoreError as exc:
        print(f"mmlens replay: {exc}", file=sys.stderr)
        return 2
    try:
        span = window(args, reader.trace_span())
        traces = [] if span is None else reader.window_traces(*span, limit=args.limit)
    finally:
        reader.close()
    if not traces:
        print(f"mmlens replay: no recorded requests in the window of {args.db}",
              file=sys.stderr)
        return 2
    family, block_size = _layout_model(traces)
    layout_model = args.layout_model or family
    if layout_model is None:
        print("mmlens replay: the recorded requests have no layout; pass --layout-model",
              file=sys.stderr)
        return 2
    try:
        fitter = TextFitter(resolve_model(layout_model), block_size)
    except (LayoutError, ValueError, OSError) as exc:
        print(f"mmlens replay: layout model {layout_model!r}: {exc}", file=sys.stderr)
        return 2
    the_plan = plan(workload(traces, {}), fitter, speed=args.speed,
                    texts=_stored_texts(traces), model=args.model, max_tokens=args.max_tokens)
    if args.dry_run:
        info = {"planned": len(the_plan.requests), "skipped": the_plan.skipped,
                "approximations": the_plan.approximations, "asked_rate": the_plan.asked_rate,
                "duration_s": the_plan.recorded_span_s / the_plan.speed}
        print(json.dumps(info) if args.json else
              "\n".join(f"{k}: {v}" for k, v in info.items()))
        return 0
    sink = TraceSink(store_writer(args.record_db) if args.record_db else None,
                     layout_model=layout_model, block_size=block_size)
    with client or httpx.Client() as http:
        summary = Replayer(http, sink=sink, concurrency=args.concurrency,
                           timeout_s=args.timeout).run(the_plan, args.to,
                                                       router_kind=args.router_kind,
                                                       stream=args.stream)
    print(json.dumps(summary.to_json()) if args.json else "\n".join(summary.lines()))
    return 0 if summary.ok == summary.sent else 1
