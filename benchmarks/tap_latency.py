"""Where the tap's added p99 comes from: the same sequential 64² requests (direct and via the
tap in turns, as ``tap_bench``) through `mmlens tap` run in variants, each variant's added
median / p90 / p99 / p99.9, a histogram of the slow requests, the proxy's own garbage
collections in the window (``gc.callbacks`` in the proxy process) and how long the proxy's
thread waited for a core (``/proc/<pid>/task/<tid>/schedstat``: run-queue wait per request).

Variants (``--variants``, comma-separated):
- ``default``: as ``mmlens tap`` runs (the bench pins the tap, proxy and recorder, to core 0).
- ``no-record``: ``--sample 0`` (the recorder process idles: its share of the core is gone).
- ``gc-off``: the proxy's collector disabled (the recorder's as usual).
- ``long-slice``: the proxy's thread given the kernel's default time slice back
  (``mmlens.cli.sched_tuning``; the tap asks for the shortest).
- ``slice-N``: the proxy's thread given a slice of N µs.
- ``rec-nice0``: the recorder at the proxy's priority (``os.setpriority`` from here).
- ``rec-core1``: the recorder moved to core 1 (the clients' and upstream's core).
- ``rec-idle``: the recorder's threads under ``SCHED_IDLE`` (they run only when nothing else
  would).
- ``rec-batch``: the recorder's threads under ``SCHED_BATCH`` (a woken one does not preempt).

Usage: python benchmarks/tap_latency.py [--requests 1500] [--rounds 2] [--variants ...]
Not a unit test: it prints figures (the load average beside them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from mmlens.cli.sched_tuning import set_slice, slice_ns

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tap_bench as tb

# Runs ``mmlens tap`` with its garbage collections timed: (start on the monotonic clock the
# bench reads too, generation, seconds), written as JSON to $TAP_GC_LOG at exit.
WRAPPER = """
import atexit, gc, json, os, sys, time
log, t = [], [0.0]
def cb(phase, info):
    if phase == "start":
        t[0] = time.perf_counter()
    else:
        log.append((t[0], info["generation"], time.perf_counter() - t[0]))
gc.callbacks.append(cb)
if os.environ.get("TAP_GC_OFF"):
    gc.disable()
    import mmlens.cli.tap as cli
    cli.tune_gc = lambda: None
atexit.register(lambda: open(os.environ["TAP_GC_LOG"], "w").write(json.dumps(log)))
from mmlens.cli.tap import main
sys.exit(main(sys.argv[1:]))
"""
EDGES_MS = (0.5, 1.0, 2.0, 4.0, 8.0)


def tasks(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def children(pid: int) -> list[int]:
    kids = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in kids.read_text().split()] if kids.exists() else []


def switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of ``pid``'s threads and its children's."""
    out = [0, 0]
    for p in (pid, *children(pid)):
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                out[0] += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                out[1] += int(line.split()[1])
    return out[0], out[1]


def runq_wait_s(pid: int) -> float:
    """Seconds the process's main thread has waited on a run queue (ready, not running)."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[1]) / 1e9


async def pairs(direct: str, via: str, reqs: list[bytes]) -> tuple[list[float], list[float],
                                                                     list[float]]:
    """Sequential requests, direct and via in turns; (direct, via, via start times)."""
    d, v, starts = [], [], []
    async with aiohttp.ClientSession() as sd, aiohttp.ClientSession() as sv:
        for i, body in enumerate(reqs):
            if i % 2:
                d.append(await tb.timed(sd, direct, body))
            starts.append(time.perf_counter())
            v.append(await tb.timed(sv, via, body))
            if not i % 2:
                d.append(await tb.timed(sd, direct, body))
    return d, v, starts


def q(xs: list[float], p: float) -> float:
    return statistics.quantiles(xs, n=1000)[int(p * 10) - 1]


def variant(name: str, up_url: str, reqs: list[bytes], tmp: Path, load: list[bytes],
            hog: bool = False) -> dict[str, object]:
    port = tb.free_port()
    db, gclog = tmp / f"{name}.db", tmp / f"{name}-gc.json"
    env = {**os.environ, "TAP_GC_LOG": str(gclog)}
    if name == "gc-off":
        env["TAP_GC_OFF"] = "1"
    cmd = [sys.executable, "-c", WRAPPER, "--listen", f"{tb.HOST}:{port}", "--upstream",
           up_url, "--db", str(db)]
    if name == "no-record":
        cmd += ["--sample", "0"]
    tap = subprocess.Popen(["taskset", "-c", "0", *cmd], cwd=tb.REPO, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    via = f"http://{tb.HOST}:{port}"
    hogp = None  # a CPU-bound neighbour on the tap's core, the same in every variant
    if hog:
        hogp = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
    try:
        asyncio.run(tb.wait_up(via, reqs[0]))
        for _ in range(50):
            if children(tap.pid):
                break
            time.sleep(0.1)
        for kid in children(tap.pid):
            for tid in tasks(kid):
                if name == "rec-nice0":
                    os.setpriority(os.PRIO_PROCESS, tid, 0)
                elif name == "rec-core1":
                    os.sched_setaffinity(tid, {1})
                elif name == "rec-idle":
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                elif name == "rec-batch":
                    os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
        if name == "long-slice":
            set_slice(0, tap.pid)
        elif name.startswith("slice-"):
            set_slice(int(name.split("-")[1]) * 1000, tap.pid)
        slices = (slice_ns(tap.pid), [slice_ns(k) for k in children(tap.pid)])
        asyncio.run(pairs(up_url, via, reqs[:100]))  # warm
        w0, t0 = runq_wait_s(tap.pid), time.perf_counter()
        d, v, starts = asyncio.run(pairs(up_url, via, reqs))
        t1, w1 = time.perf_counter(), runq_wait_s(tap.pid)
        if hogp is not None:
            hogp.kill()
            hogp.wait()
            hogp = None
        cpu, sw = (0.0, 0.0), [0.0, 0.0]
        if load:  # then CPU per recorded request, 32 in flight
            before, parts0, sw0 = tb.settled(db), tb.cpu_parts(tap.pid), switches(tap.pid)
            asyncio.run(tb.throughput(via, load, 32))
            tb.wait_stored(db, before + len(load))
            sw = [(b - a) / len(load) for a, b in zip(sw0, switches(tap.pid), strict=True)]
            cpu = tuple((b - a) / len(load) * 1e6  # type: ignore[assignment]
                        for a, b in zip(parts0, tb.cpu_parts(tap.pid), strict=True))
    finally:
        if hogp is not None:
            hogp.kill()
            hogp.wait()
        tb.stop(tap)
    gcs = [g for g in json.loads(gclog.read_text()) if t0 <= g[0] <= t1] \
        if gclog.exists() else []
    base = statistics.median(d)
    extra = [x - base for x in v]
    slow = [i for i, x in enumerate(extra) if x > 1e-3]
    in_gc = sum(1 for i in slow if any(starts[i] <= g[0] <= starts[i] + v[i] for g in gcs))
    hist = [sum(1 for x in extra if lo <= x * 1e3 < hi)
            for lo, hi in zip((0.0, *EDGES_MS), (*EDGES_MS, 1e9), strict=True)]
    return {"median": statistics.median(v) - base, "p90": q(v, 90) - q(d, 90),
            "p99": q(v, 99) - q(d, 99), "p999": q(v, 99.9) - q(d, 99.9), "hist": hist,
            "gcs": len(gcs), "gc_max": max((g[2] for g in gcs), default=0.0),
            "slow_in_gc": in_gc, "slow": len(slow),
            "runq_us": (w1 - w0) / len(reqs) * 1e6, "slices": slices,
            "proxy_us": cpu[0], "recorder_us": cpu[1], "switches": sw}


def fmt_slices(slices: object) -> str:
    proxy, rec = slices  # type: ignore[misc]
    return f"{(proxy or 0) / 1e3:.0f}, {','.join(f'{(r or 0) / 1e3:.0f}' for r in rec)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=2, help="the variants in turns, this often")
    ap.add_argument("--throughput", type=int, default=0,
                    help="then this many requests, 32 in flight: CPU µs per recorded request")
    ap.add_argument("--hog", action="store_true",
                    help="a busy loop on the tap's core while the sequential requests run")
    ap.add_argument("--variants", default="default,long-slice,no-record,rec-core1")
    args = ap.parse_args()
    names = args.variants.split(",")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at start; "
          f"{args.requests} sequential 64² PNG requests per variant and round")
    up_port = tb.free_port()
    up_url = f"http://{tb.HOST}:{up_port}"
    upstream = tb.spawn([sys.executable, tb.__file__, "--serve-upstream", str(up_port)], 1)
    hdr = " < ".join(f"{e:g}" for e in EDGES_MS)
    print(f"{'variant':>10} | added ms: median    p90    p99  p99.9 | via−direct median, "
          f"count per bucket (ms: {hdr}) | proxy gc: n, max ms, slow(>1 ms) in one | "
          f"proxy run-queue wait µs/req")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(tb.wait_up(up_url, tb.chat_body(tb.photo(64, "PNG", 0), "PNG")))
            got: dict[str, list[dict[str, object]]] = {n: [] for n in names}
            for r in range(args.rounds):
                reqs = tb.bodies(64, "PNG", args.requests, start=r * args.requests)
                for name in names:
                    load = tb.bodies(64, "PNG", args.throughput, start=(r + 7) * args.requests
                                     ) if args.throughput else []
                    m = variant(name, up_url, reqs, Path(tmp), load, args.hog)
                    got[name].append(m)
                    print(f"{name:>10} | {m['median'] * 1e3:15.3f} {m['p90'] * 1e3:6.2f} "
                          f"{m['p99'] * 1e3:6.2f} {m['p999'] * 1e3:6.2f} | "
                          f"{' '.join(f'{c:>5}' for c in m['hist'])} | "  # type: ignore[union-attr]
                          f"{m['gcs']:>4} {m['gc_max'] * 1e3:6.2f} {m['slow_in_gc']:>3}/"
                          f"{m['slow']:<4} | {m['runq_us']:8.1f}   slice µs (proxy, recorder) "
                          f"{fmt_slices(m['slices'])}" + (
                              f"; CPU µs/req proxy {m['proxy_us']:.0f} recorder "
                              f"{m['recorder_us']:.0f}, context switches per request "
                              f"{m['switches'][0]:.2f} voluntary, {m['switches'][1]:.2f} "  # type: ignore[index]
                              f"preempted" if args.throughput else "") +
                          f" (load {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        tb.stop(upstream)
    print(f"medians over {args.rounds} rounds (added ms: median / p99 / p99.9; run-queue wait "
          f"µs per request):")
    for name, ms in got.items():
        med = {k: statistics.median(float(m[k]) for m in ms)  # type: ignore[arg-type]
               for k in ("median", "p99", "p999", "runq_us", "proxy_us", "recorder_us")}
        print(f"{name:>10}: {med['median'] * 1e3:.3f} / {med['p99'] * 1e3:.2f} / "
              f"{med['p999'] * 1e3:.2f}; {med['runq_us']:.0f} µs" + (
                  f"; CPU µs per recorded request: proxy {med['proxy_us']:.0f}, recorder "
                  f"{med['recorder_us']:.0f}" if args.throughput else ""))
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
