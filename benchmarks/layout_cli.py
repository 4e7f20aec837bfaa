"""`mmlens layout` as a user runs it: the whole CLI call (interpreter start, imports, model
load, layout, printing) with a model directory, beside the same call with a family name
(prints figures; not a unit test).

Usage: python benchmarks/layout_cli.py [--runs 5] [--json]

Model directories: the demo's (``mmlens.demo.model_dirs.ensure_model_dir``: Qwen3-VL with the
real Qwen3 vocabulary, Kimi-K3 with a shape-faithful one). Wall seconds of each call, median of
``--runs`` interleaved rounds, and its CPU seconds (user + system of the child process: the
figure a shared, loaded machine does not inflate); a call that writes anything to stderr is
reported. The calls run with bytecode caching on (one untimed call per case first): an
installed mmlens has its modules compiled (pip compiles them at install), so a user's call
never compiles them from source, as it would under PYTHONDONTWRITEBYTECODE (~60 ms a call).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from mmlens.demo.model_dirs import ensure_model_dir

CASES = {"qwen3-vl dir": lambda: str(ensure_model_dir("qwen3-vl")),
         "kimi-k3 dir": lambda: str(ensure_model_dir("kimi-k3")),
         "qwen3-vl family name": lambda: "qwen3-vl"}


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def one_call(model: str) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stderr) of one whole CLI call."""
    c, t = child_cpu(), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mmlens", "layout", "--model", model,
                           "--image", "640x480"], capture_output=True, text=True, check=True,
                          env=ENV)
    return time.perf_counter() - t, child_cpu() - c, done.stderr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    args = ap.parse_args()
    models = {name: make() for name, make in CASES.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    cpus: dict[str, list[float]] = {name: [] for name in models}
    stderr: dict[str, str] = {}
    for model in models.values():  # writes the bytecode an install would hold
        one_call(model)
    for _ in range(args.runs):
        for name, model in models.items():
            took, cpu, err = one_call(model)
            times[name].append(took)
            cpus[name].append(cpu)
            if err:
                stderr[name] = err
    med = {name: statistics.median(t) for name, t in times.items()}
    cpu = {name: statistics.median(c) for name, c in cpus.items()}
    for name, t in med.items():
        print(f"mmlens layout --model <{name}> --image 640x480: median {cpu[name]:.2f} CPU-s, "
              f"{t:.2f} s wall (best {min(times[name]):.2f} s of {args.runs})"
              + (f"; stderr: {stderr[name].strip()[:200]!r}" if name in stderr else ""))
    print(f"(load average {os.getloadavg()[0]:.1f})")
    if args.json:
        print(json.dumps({"layout_cli": {"median_s": med, "median_cpu_s": cpu,
                                         "stderr": sorted(stderr)}}))


if __name__ == "__main__":
    main()
