"""Re-run the faults of issue 16 at its scale and print what happened (not a unit test).

Usage: python benchmarks/fault_rerun.py [--scale 1.0] [--seed 16] [--skip-kill9]

1. Fuzz: as many inputs per parser as the issue tried (KV batches, router log lines, cache-trace
   headers, mmlens.toml documents, ready files, processor configs), built by random mutation
   of real shapes and the numbers that broke them; an exception other than the parser's
   declared error type is a crash.
2. Faults against the collector (``tests/faults/harness.py``): publisher restart (2 s down),
   gaps with an answering, lossy, silent (never answers), silent-then-answering (3 s) or
   absent replay, garbage frames, two collectors on one store, ``mmlens collect`` killed
   with SIGKILL mid-write (250,000 events).
Prints one line per parser (inputs, crashes) and per fault (events published, stored, lost,
duplicate rows, seconds; for gaps, what the KV health says: batches recovered late, given up
and why, lost).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the fault harness lives with the tests

import msgspec  # noqa: E402

from mmlens.config import Config, ConfigError, apply_ready, read_ready_file  # noqa: E402
from mmlens.errors import LayoutError  # noqa: E402
from mmlens.ingest import dynamo_logs, router_logs  # noqa: E402
from mmlens.ingest.kv_index import KVIngest  # noqa: E402
from mmlens.ingest.observed_logs import read_lines  # noqa: E402
from mmlens.layout.families import FAMILIES, Family  # noqa: E402
from mmlens.store.sqlite import Store  # noqa: E402
from mmlens.targets_toml import validate_toml  # noqa: E402
from tests.faults import harness  # noqa: E402
from tests.fuzz.strategies import SEED_LINES, toml_value  # noqa: E402

_In = TypeVar("_In")  # what a fuzz target takes: the generator makes it
NASTY = [0, -1, 1 << 63, 1 << 64, -(1 << 64), 10**30, 10**400, 1e308, float("inf"),
         float("-inf"), float("nan"), True, None, "", "1.2.3", "1e999", "9" * 5000, [], {}]
KEYS = ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "extra_keys",
        "medium", "ts", "events", "data_parallel_rank", "url", "name", "workers", "routers",
        "log", "metrics", "kv_events", "kv_replay", "dp_size", "router", "router_log",
        "selections", "prediction", "dispatch_timestamp_ns", "matched_units", "input_units",
        "patch_size", "max_patches", "image_size", "vision_config", "max_pixels", "min_pixels",
        "crop_size", "image_grid_pinpoints", "merge_size", "pixel_shuffle_ratio"]
ADDRESSES = ["tcp://127.0.0.1:99999", "tcp://127.0.0.1:5557", "http://127.0.0.1:8000",
             "grpc://127.0.0.1:50051", "/etc/passwd", "../../x.log", "tcp://[bad", "ipc://"]


def value(r: random.Random, depth: int = 0) -> object:
    k = r.random()
    if depth > 3 or k < 0.45:
        return r.choice(NASTY + ADDRESSES + [r.randint(-5, 70_000), r.random() * 1e6,
                                             r.choice(KEYS), "BlockStored", "BlockRemoved"])
    if k < 0.7:
        return [value(r, depth + 1) for _ in range(r.randint(0, 4))]
    return {r.choice(KEYS): value(r, depth + 1) for _ in range(r.randint(0, 5))}


def kv_payload(r: random.Random) -> bytes:
    enc = msgspec.msgpack.Encoder()
    k = r.random()
    if k < 0.05:
        return b"\x91" * r.randint(10, 200_000) + b"\x00"
    if k < 0.15:
        return r.randbytes(r.randint(0, 64))
    stored = {"type": "BlockStored", "block_hashes": [r.getrandbits(64)], "token_ids": [1] * 16,
              "block_size": 16, "parent_block_hash": None}
    event = dict(stored)
    for _ in range(r.randint(0, 3)):
        event[r.choice(KEYS[:7])] = value(r)
    batch: object = [r.choice([time.time(), value(r)]), [event, value(r)][: r.randint(1, 2)],
                     r.choice([0, value(r)])]
    if r.random() < 0.3:
        batch = value(r)
    try:
        return enc.encode(batch)
    except (TypeError, OverflowError, ValueError):
        return json.dumps(batch, default=str).encode()


def log_line(r: random.Random) -> str:
    import re

    line = r.choice(SEED_LINES)
    for _ in range(r.randint(1, 3)):
        k = r.random()
        nums = list(re.finditer(r"-?\d+(\.\d+)?", line))
        if k < 0.5 and nums:
            m = r.choice(nums)
            line = line[:m.start()] + str(r.choice(NASTY)) + line[m.end():]
        elif k < 0.7:
            at = r.randrange(len(line) + 1)
            line = line[:at] + r.choice(['{', '"', "\\ud800", "é", "\x00", "]"]) + line[at:]
        elif k < 0.8:
            line = "{" * r.randint(1, 5000) + line
        else:
            line = json.dumps(value(r), default=str)
    return line


def cache_header(r: random.Random) -> str:
    trace = {"dispatch_timestamp_ns": r.choice(NASTY), "selections": [
        {"worker": value(r), "prediction": {"overlap_blocks": r.choice(NASTY),
                                            "matched_units": r.choice(NASTY),
                                            "input_units": r.choice(NASTY)},
         "candidates": value(r), "scores": value(r), "gates": value(r)}]}
    text = json.dumps(trace if r.random() < 0.7 else value(r), default=str)
    return text if r.random() < 0.9 else "[" * r.randint(1, 100_000)


def toml_doc(r: random.Random) -> str:
    tables = {"router": [{"url": r.choice(ADDRESSES), "log_file": r.choice(ADDRESSES),
                          "kind": value(r)}],
              "worker": [{"kv_events": r.choice(ADDRESSES), "dp_size": r.choice(NASTY),
                          "kv_replay": value(r)}],
              "store": value(r), "interval_s": r.choice(NASTY), "demo": value(r)}
    doc = {k: v for k, v in tables.items() if r.random() < 0.6 and v is not None}
    return "\n".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in doc.items())


def ready_line(r: random.Random) -> object:
    line = {"event": "ready", "router": r.choice([*ADDRESSES, value(r)]),
            "router_log": r.choice([*ADDRESSES, value(r)]),
            "workers": [{"name": value(r), "kv_events": r.choice(ADDRESSES),
                         "dp_size": r.choice(NASTY), "metrics": value(r)}],
            "routers": r.choice([None, value(r)])}
    return {k: v for k, v in line.items() if r.random() < 0.8}


def fuzz(name: str, n: int, make: Callable[[random.Random], _In],
         run: Callable[[_In], object], declared: tuple[type[BaseException], ...],
         r: random.Random) -> None:
    crashes: Counter[str] = Counter()
    started = time.perf_counter()
    for _ in range(n):
        item = make(r)
        try:
            run(item)
        except declared:
            pass
        except Exception as exc:
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            crashes[f"{type(exc).__name__} {Path(frame.filename).name}:{frame.lineno}"] += 1
    print(f"fuzz {name:<22} {n:>9,} inputs  {sum(crashes.values()):>6} crashes  "
          f"{time.perf_counter() - started:6.1f} s  {dict(crashes.most_common(3)) or ''}",
          flush=True)


def run_fuzz(scale: float, r: random.Random, tmp: Path) -> None:
    store = Store(":memory:")

    def kv(p: bytes) -> None:
        store.add_kv_events(KVIngest().ingest("w", r.getrandbits(63), p))

    def logs(line: str) -> None:
        store.add_decisions(router_logs.parse_lines([line], {}))
        d, f = read_lines([line], {})
        store.add_decisions(d)
        store.add_traces(f)
        dynamo_logs.model_mm_routing([line])
        dynamo_logs.image_token_counts([line])

    ready_path = tmp / "ready.json"

    def ready(line: object) -> None:
        ready_path.write_text(json.dumps(line, default=str))
        apply_ready(Config(), read_ready_file(ready_path), tmp)

    def processor(item: tuple[Family, dict[str, Any]]) -> None:
        family, cfg = item
        family.image_token_count(r.randint(1, 70_000), r.randint(1, 70_000), cfg)

    n = lambda base: max(1, int(base * scale))  # noqa: E731
    fuzz("kv batches", n(134_758), kv_payload, kv, (), r)
    fuzz("router log lines", n(12_909), log_line, logs, (), r)
    fuzz("cache-trace headers", n(87_225), cache_header,
         lambda t: store.add_decisions([router_logs.cache_trace_from_header(t)]),
         (), r)
    fuzz("mmlens.toml", n(166_456), toml_doc, validate_toml, (ConfigError,), r)
    fuzz("ready files", n(506_819), ready_line, ready, (ConfigError,), r)
    fuzz("processor configs", n(200_000),
         lambda r: (r.choice(FAMILIES), {r.choice(KEYS[-12:]): value(r) for _ in range(3)}),
         processor, (LayoutError,), r)
    store.close()


def run_faults(scale: float, tmp: Path, kill9: bool) -> None:
    def report(name: str, t: harness.Tally, kv: bool = False) -> None:
        print(f"fault {name:<38} published {t.published:>8,}  stored {t.stored:>8,}  "
              f"lost {t.lost:>6,} (never delivered, no replay: {t.dropped if t.lost else 0:>4,})"
              f"  duplicate rows {t.duplicates:>5,}  crashes {t.crashes}  {t.seconds:6.1f} s"
              f"{kv_health(t) if kv else ''}", flush=True)

    events = max(100, int(5000 * scale))
    report("publisher restart (2 s)", harness.publisher_restart(tmp / "a.db", events, 2.0))
    for mode in ("answer", "lossy", "silent", "silent_then_answers", None):
        name = "silent 3 s, then answers" if mode == "silent_then_answers" else mode
        report(f"gaps, replay {name}", harness.gaps(tmp / f"g{mode}.db", events, mode,
                                                   silent_s=3.0), kv=True)
    t, injected = harness.garbage(tmp / "garbage.db", events)
    report(f"garbage ({sum(injected.values())} bad)", t)
    report("two collectors, one store", harness.two_collectors(tmp / "two.db", events))
    if kill9:
        n = max(1000, int(250_000 * scale))
        report("kill -9 mid-write, restart", harness.kill9_mid_write(
            tmp / "k.db", tmp, events=n, rate=20_000.0, kills=2))


def kv_health(t: harness.Tally) -> str:
    """The KV endpoint's own account: batches lost, recovered late, given up (and why)."""
    c: dict[str, float] = {}
    for row in t.health:
        if row["collector"] == "kv_events":
            for k, v in row["counters"].items():
                c[k] = c.get(k, 0) + v
    given_up = {k.split(":", 1)[1]: int(v) for k, v in c.items()
                if k.startswith("given_up_batches:")}
    return (f"  | health: lost_batches {int(c.get('lost_batches', 0))}, late_recovered "
            f"{int(c.get('late_recovered_batches', 0))}, given up {given_up or 0}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the issue's counts")
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--skip-kill9", action="store_true")
    ap.add_argument("--only", choices=["fuzz", "faults"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mmlens-faults-") as d:
        tmp = Path(d)
        if args.only != "faults":
            run_fuzz(args.scale, random.Random(args.seed), tmp)
        if args.only != "fuzz":
            run_faults(args.scale, tmp, not args.skip_kill9)
    return 0


if __name__ == "__main__":
    sys.exit(main())
