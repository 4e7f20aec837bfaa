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
from mmlens.whatif.report import Figures, ScenarioReport
from mmlens.whatif.scenario import Scenario, ScenarioError, parse, recorded_workers

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

def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:,.0f}"


ROWS = (("hit rate (tokens)", "hit_rate", _pct), ("cached tokens", "cached_tokens", _num),
        ("false-hit tokens", "false_hit_tokens", _num),
        ("avoidable tokens", "avoidable_tokens", _num),
        ("prefill tokens", "prefill_tokens", _num), ("load spread (max/mean)", "spread",
                                                     lambda v: "—" if v is None else f"{v:.2f}"))


def _err(name: str, value: float | None, fmt: str) -> str:
    if value is None:
        return ""
    if name == "hit_rate":
        return f" ±{abs(100 * value):.1f}pt"
    return f" ±{abs(value):,.0f}" if fmt == "num" else f" ±{abs(value):.2f}"


def _column(f: Figures, err: dict[str, float | None] | None) -> list[str]:
    out = []
    for _, name, fmt in ROWS:
        cell = fmt(getattr(f, name))
        if err is not None:
            cell += _err(name, err.get(name), "num" if fmt is _num else "x")
        out.append(cell)
    return out


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def table(c: Comparison, span: tuple[float, float], minutes: bool = False) -> list[str]:
    b = c.baseline
    lines = [f"window {_when(span[0])} – {_when(span[1])} UTC: {len(c.workload)} requests, "
             f"{len(b.run.requests)} modelled ({b.run.skipped} of unknown prompt length "
             f"skipped; keys synthesized for {sum(p.synthetic for p in b.run.prompts)}), "
             f"{c.measured.requests} measured, workers {' '.join(c.workers) or '—'}",
             f"baseline: {b.run.scenario.policy} {b.run.scenario.mode or ''} "
             f"bs{b.run.scenario.block_size} {b.run.scenario.workers}w "
             f"{b.run.scenario.capacity_blocks}blk; routed as recorded for "
             f"{_pct(b.worker_agreement)} of requests",
             "± after a figure: the baseline model's distance from the measurement there"]
    heads = ["", "recorded", "baseline", *[s.run.scenario.label for s in c.scenarios]]
    cols = [[label for label, _, _ in ROWS], _column(c.measured, None),
            _column(b.total, c.error), *[_column(s.total, c.error) for s in c.scenarios]]
    extra = [("saving vs recorded", ["", _num(b.saving_tokens),
                                     *[_num(s.saving_tokens) for s in c.scenarios]])]
    verdicts = sorted({k for f in [c.measured, b.total, *(s.total for s in c.scenarios)]
                       for k, v in f.verdicts.items() if v})
    for k in verdicts:
        extra.append((f"verdict {k}", [str(f.verdicts.get(k, 0)) for f in
                                       [c.measured, b.total, *(s.total for s in c.scenarios)]]))
    for label, cells in extra:
        cols[0].append(label)
        for col, cell in zip(cols[1:], cells, strict=True):
            col.append(cell)
    widths = [max(len(h), *(len(x) for x in col)) for h, col in zip(heads, cols, strict=True)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)))
    for row in range(len(cols[0])):
        lines.append("  ".join(col[row].ljust(w) for col, w in zip(cols, widths, strict=True)))
    lines += _worker_lines(c)
    if minutes:
        lines += _minute_lines(c)
    return lines


def _worker_lines(c: Comparison) -> list[str]:
    out = ["requests per worker:"]
    for name, f in [("recorded", c.measured), ("baseline", c.baseline.total),
                    *[(s.run.scenario.label, s.total) for s in c.scenarios]]:
        out.append(f"  {name}: " + " ".join(f"{w}={n}" for w, n in f.worker_requests.items()))
    return out


def _minute_lines(c: Comparison) -> list[str]:
    reports: list[ScenarioReport] = [c.baseline, *c.scenarios]
    out = ["hit rate per minute: " + " | ".join(["recorded", *[r.run.scenario.label
                                                               for r in reports]])]
    for m, f in c.measured_minutes.items():
        cells = [_pct(f.hit_rate)] + [_pct(r.minutes[m].hit_rate) if m in r.minutes else "—"
                                      for r in reports]
        out.append(f"  {_when(m)[11:16]}  " + " | ".join(cells))
    return out
