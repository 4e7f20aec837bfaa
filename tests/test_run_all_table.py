"""benchmarks/run_all.py turns each benchmark's JSON figures into the README's table rows
(format only, nothing timed)."""

import importlib.util
import sys
from pathlib import Path

SPEC = importlib.util.spec_from_file_location(
    "run_all", Path(__file__).resolve().parents[1] / "benchmarks" / "run_all.py")
run_all = importlib.util.module_from_spec(SPEC)
sys.modules["run_all"] = run_all  # its dataclass looks its module up
SPEC.loader.exec_module(run_all)

FIGURES = {
    "kv": {"kv": {"ingest": {"ingest_mblocks": 0.5, "decode_mblocks": 2.0, "resident": 400045},
                  "sqlite": {"collector_mblocks": 0.9, "recorder_mblocks": 1.8,
                             "server_cpu_s": 0.0, "recorder_server_cpu_s": 0.0}}},
    "memory": {"kv": {"memory": {"rss_mb_per_mblocks": 150.0}}},
    "availability": {"availability": {"median_ms": 0.5, "p95_ms": 0.9, "floor_ms": 0.25,
                                      "workers": 64, "resident": 100000, "distinct": 300}},
    "logs": {"observed": {"smg_1.13": {"log_decisions": 60_000, "log_s": 1.0,
                                       "lines": 300_000, "decode_s": 0.5}}},
    "collect": {"collect_logs": {
        "backlog": {"requests": 20_000, "decisions": 72_000, "stored": 72_000, "cpu_s": 3.0,
                    "wall_s": 6.0, "floor_s": 2.0, "interval_s": 5.0},
        "sustained": {"rate": 2000.0, "seconds": 20.2, "decisions": 144_000, "stored": 143_000,
                      "max_backlog_mb": 1.5, "drain_s": 0.8, "cpu_s": 7.1,
                      "interval_s": 5.0}}},
    "layout": {"layout_cli": {"median_s": {"qwen3-vl dir": 0.9, "kimi-k3 dir": 1.3,
                                           "qwen3-vl family name": 0.8},
                              "median_cpu_s": {"qwen3-vl dir": 0.8, "kimi-k3 dir": 1.2,
                                               "qwen3-vl family name": 0.7}, "stderr": []}},
    "whatif": {"whatif": {"requests": 100_000, "workers": 64, "capacity": 100_000,
                          "floor_s": 0.5, "scenarios": {"dynamo kv exact": {"cpu_s": 12.0},
                                                        "round_robin": {"cpu_s": 5.0}}}},
}


def test_every_benchmark_gives_rows_with_ratio_and_verdict():
    rows = [r for name, f in FIGURES.items() for r in run_all.TABLES[name](f)]
    text = run_all.table(rows)
    lines = text.splitlines()
    assert lines[0].startswith("| path | mmlens | peer / floor")
    assert len(lines) == 2 + len(rows) == 2 + 11
    by_path = {r.path: r for r in rows}
    ingest = by_path["KV ingest (`KVIngest`), 400k-block resident index"]
    assert (ingest.ratio, ingest.met) == ("0.25×", False)
    sqlite = by_path["KV collector path + store (SQLite)"]
    assert (sqlite.ratio, sqlite.met) == ("0.50×", True)
    avail = by_path["availability per distinct request (300), 64 workers × 100k blocks"]
    assert (avail.ratio, avail.met) == ("2.00×", True)
    slow = by_path["`mmlens whatif` replay, 100k requests over 64 workers × 100k blocks: "
                   "dynamo kv exact"]
    assert (slow.ratio, slow.met) == ("24×", False)
    logs = by_path["SMG router-log ingest (to rows in SQLite)"]
    assert logs.mmlens.startswith("60,000 decisions/s") and logs.met
    backlog = by_path["`mmlens collect` following an SMG log, 20k requests appended at once "
                      "(the whole process)"]
    assert backlog.mmlens.startswith("24,000 decisions/CPU-s (12,000/s wall")
    assert (backlog.ratio, backlog.met) == ("0.67×", True)
    steady = by_path["`mmlens collect` at 2,000 SMG requests/s for 20 s"]
    assert steady.mmlens.startswith("34% of a core") and steady.met is False  # one lost
    met = {r.path.split(", ")[-1]: r.met for r in rows if r.path.startswith("`mmlens layout")}
    assert met == {"qwen3-vl dir (whole CLI call)": True,
                   "kimi-k3 dir (whole CLI call)": False}
    assert all(line.count("|") == 7 for line in lines)
