"""`mmlens whatif --db PATH [--since T] [--until T] [--scenario SPEC …] [--json]`: replay a
recorded window through models of other routers, modes, block sizes and cache sizes.

Each ``--scenario`` is ``key=value,…``: ``policy`` (cache_aware | dynamo_kv | round_robin |
random | consistent_hashing), ``mode`` (SMG: router | worker; Dynamo: exact | text_prefix |
approximate), ``block_size``, ``workers``, ``capacity_blocks``, ``seed``, ``name``, and any
parameter of the policy by its flag's name (``balance_abs_threshold=8``,
``router_temperature=0.5``). ``--policy``/``--mode``/``--block-size``/``--workers``/
``--capacity-blocks`` give one more scenario and the defaults of the others. The recorded
configuration is always replayed too (the baseline); its distance from what was measured is
printed beside every figure: the model's own error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

from mmlens.cli.window import add_window_args, window
from mmlens.store.open import StoreError
from mmlens.store.reader import open_reader
from mmlens.whatif.blocks import BlockSizeError
from mmlens.whatif.compare import Comparison, compare, recorded_capacity
from mmlens.whatif.scenario import Scenario, ScenarioError, parse, recorded_workers
from mmlens.whatif.table import aligned, figure_rows, headers, minute_rows, pct

DEFAULT_CAPACITY = 2048  # the demo engines' --num-blocks, when the store does not say


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmlens whatif", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True)
    add_window_args(p)
    p.add_argument("--scenario", action="append", default=[], metavar="SPEC",
                   help="key=value,… (repeat for several)")
    p.add_argument("--policy", help="one more scenario's policy")
    p.add_argument("--mode", help="router | worker (SMG); exact | text_prefix | approximate "
                                  "(Dynamo)")
    p.add_argument("--block-size", type=int)
    p.add_argument("--workers", type=int)
    p.add_argument("--capacity-blocks", type=int,
                   help="each engine's cache in blocks (default: the recorded engines')")
    p.add_argument("--baseline-capacity-blocks", type=int,
                   help="the recorded engines' capacity, when their metrics were not stored "
                        f"(default {DEFAULT_CAPACITY})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--minutes", action="store_true", help="also print the hit rate per minute")
    p.add_argument("--json", action="store_true")
    return p


def scenarios_of(args: argparse.Namespace, defaults: Scenario) -> list[Scenario]:
    base = defaults
    for key, value in (("block_size", args.block_size), ("workers", args.workers),
                       ("capacity_blocks", args.capacity_blocks)):
        if value is not None:
            base = replace(base, **{key: value})
    base = replace(base, seed=args.seed)
    out = [parse(spec, base) for spec in args.scenario]
    if args.policy or args.mode or not out:
        flags = ",".join(f"{k}={v}" for k, v in (("policy", args.policy), ("mode", args.mode))
                         if v)
        out.append(parse(flags, base))
    return out


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    try:
        reader = open_reader(args.db)
    except StoreError as exc:
        print(f"mmlens whatif: {exc}", file=sys.stderr)
        return 2
    try:
        span = window(args, reader.trace_span())
        if span is None:
            print(f"mmlens whatif: no traces in {args.db}", file=sys.stderr)
            return 2
        workload = reader.workload(*span)
        capacity = (args.baseline_capacity_blocks
                    or recorded_capacity(reader.samples(span[0] - 3600.0,
                                                        ["vllm:cache_config_info"]))
                    or DEFAULT_CAPACITY)
    finally:
        reader.close()
    if not workload:
        print("mmlens whatif: no requests in the window", file=sys.stderr)
        return 2
    defaults = Scenario(workers=max(len(recorded_workers(workload)), 1),
                        capacity_blocks=capacity,
                        block_size=next((r.keys.block_size for r in workload if r.keys), 16))
    try:
        scenarios = scenarios_of(args, defaults)
        result = compare(workload, scenarios, capacity_blocks=capacity)
    except (ScenarioError, BlockSizeError) as exc:
        print(f"mmlens whatif: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"since": span[0], "until": span[1], **result.as_json()}))
        return 0
    print("\n".join(table(result, span, minutes=args.minutes)))
    return 0


# --- the text table ---------------------------------------------------------------------------

def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def table(c: Comparison, span: tuple[float, float], minutes: bool = False) -> list[str]:
    b = c.baseline
    sc = b.run.scenario
    lines = [f"window {_when(span[0])} – {_when(span[1])} UTC: {len(c.workload)} requests, "
             f"{len(b.run.requests)} modelled ({b.run.skipped} of unknown prompt length "
             f"skipped; keys synthesized for {sum(p.synthetic for p in b.run.prompts)}), "
             f"{c.measured.requests} measured, workers {' '.join(c.workers) or '—'}",
             f"baseline: {sc.policy} {sc.mode or ''} bs{sc.block_size} {sc.workers}w "
             f"{sc.capacity_blocks}blk; routed as recorded for {pct(b.worker_agreement)} of "
             "requests",
             "± after a figure: the baseline model's distance from the measurement there"]
    lines += aligned(headers(c), figure_rows(c))
    lines.append("requests per worker:")
    for name, f in [("recorded", c.measured), ("baseline", b.total),
                    *[(s.run.scenario.label, s.total) for s in c.scenarios]]:
        lines.append(f"  {name}: " + " ".join(f"{w}={n}" for w, n in f.worker_requests.items()))
    if minutes:
        lines.append("hit rate per minute (UTC):")
        lines += ["  " + line for line in aligned(["minute", *headers(c)[1:]], minute_rows(c))]
    return lines
