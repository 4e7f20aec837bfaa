"""Issue 24's check on the real routers: record a mixed workload on the demo's real SMG in router
mode, then `mmlens replay` it (the replay's own planner and sender) to fresh real
configurations and measure each one's token-weighted hit rate from the engines' own counters
(vllm:prefix_cache_hits / vllm:prefix_cache_queries, summed over the workers) and from the
responses' usage; with `mmlens whatif`'s prediction per configuration beside it.

The workload (seeded): Poisson arrivals; 30 % text-only requests drawn from a pool of long
texts, 70 % one or two images (24 identities, six of each of four sizes, so same-size
different images abound) drawn by popularity (1/rank) with a short question; 8-32 output
tokens. Every configuration starts with fresh engines.

    python benchmarks/whatif_live.py [--requests 320] [--rate 6] [--num-blocks 512]
        [--targets smg-router,smg-worker,dynamo-kv,smg-half] [--keep DIR] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
from mmlens.collectors.replay_sender import Replayer  # noqa: E402
from mmlens.collectors.trace_sink import TraceSink, store_writer  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from mmlens.layout.modeldir import resolve_model  # noqa: E402
from mmlens.replay.images import cached_identity_png  # noqa: E402
from mmlens.replay.plan import Plan, PlannedImage, PlannedRequest, plan  # noqa: E402
from mmlens.replay.summary import Outcome, hit_rate  # noqa: E402
from mmlens.replay.text import TextFitter  # noqa: E402
from mmlens.store.reader import open_reader  # noqa: E402
from mmlens.whatif.workload import workload  # noqa: E402

MODEL_FAMILY = "qwen3-vl"
SIZES = ((224, 224), (448, 336), (640, 480), (800, 600))
IMAGES_PER_SIZE = 6
QUESTIONS = (
    "Describe this image in detail.",
    "What is the main colour of this picture?",
    "Is there any text visible here? Answer briefly.",
    "Count the objects you can see and list them.",
    "Write a one-line caption for this image.",
    "What would be a good title for this photograph?",
)
TOPICS = ("the history of bridges", "how tides work", "a recipe for bread", "the rules of chess",
          "why the sky is blue", "the life of bees", "how a compiler works", "the moon landing",
          "composting at home", "the planets of the solar system", "how vaccines work",
          "the origins of jazz")
FILLER = ("Please be thorough and explain each step carefully, with examples where they help, "
          "and mention common mistakes people make.")


@dataclass(frozen=True)
class Target:
    """One real configuration a workload is sent to."""

    name: str
    router: str  # smg | dynamo
    mm_processing: str | None = "router"  # SMG only
    num_blocks: int = 512
    workers: int = 2

    @property
    def kind(self) -> str:
        return self.router


@dataclass
class Live:
    url: str
    kind: str
    model: str
    model_dir: str
    metrics: list[str]


@dataclass
class Measured:
    """One configuration's run: the engines' own counters and the responses' usage."""

    target: str
    sent: int
    ok: int
    engine_hit_rate: float | None
    usage_hit_rate: float | None
    engine_prompt_tokens: int
    workers: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    cpu_s: float = 0.0


def scenarios(num_blocks: int) -> dict[str, str]:
    """The `mmlens whatif --scenario` predicting each target from the recording."""
    return {
        "smg-worker": "name=smg-worker,policy=cache_aware,mode=worker",
        "dynamo-kv": "name=dynamo-kv,policy=dynamo_kv",
        "smg-half": ("name=smg-half,policy=cache_aware,mode=router,"
                     f"capacity_blocks={num_blocks // 2}"),
    }


def predict(db: Path, num_blocks: int, names: Sequence[str]) -> dict[str, float | None]:
    """`mmlens whatif`'s predicted token-weighted hit rate per target (the baseline model's
    for smg-router), run as users run it."""
    specs = scenarios(num_blocks)
    cmd = [sys.executable, "-m", "mmlens", "whatif", "--db", str(db), "--json",
           "--baseline-capacity-blocks", str(num_blocks)]
    for name in names:
        if name in specs:
            cmd += ["--scenario", specs[name]]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                    cwd=REPO, timeout=600).stdout)
    found: dict[str, float | None] = {"smg-router": out["baseline"]["total"]["hit_rate"]}
    for sc in out["scenarios"]:
        found[sc["scenario"]["name"]] = sc["total"]["hit_rate"]
    return found


def targets(num_blocks: int) -> dict[str, Target]:
    return {
        "smg-router": Target("smg-router", "smg", "router", num_blocks),
        "smg-worker": Target("smg-worker", "smg", "worker", num_blocks),
        "dynamo-kv": Target("dynamo-kv", "dynamo", None, num_blocks),
        "smg-half": Target("smg-half", "smg", "router", num_blocks // 2),
    }


@contextlib.contextmanager
def running(target: Target, log_dir: Path | None = None) -> Iterator[Live]:
    """The target's cluster, fresh, on free loopback ports; stopped on exit."""
    from tests.live_support import free_port_base, started

    if target.router == "dynamo":
        from mmlens.demo.dynamo_cluster import DynamoCluster, DynamoClusterConfig, ports_needed

        def make_dynamo() -> DynamoCluster:
            base = free_port_base(ports=lambda b: ports_needed(DynamoClusterConfig(
                port_base=b, workers=target.workers)))
            return DynamoCluster(DynamoClusterConfig(
                family=MODEL_FAMILY, workers=target.workers, port_base=base,
                num_blocks=target.num_blocks, ready_timeout=120.0, log_dir=log_dir))

        with started(make_dynamo) as dyn:
            info = dyn.ready_info()
            yield Live(info["router"], "dynamo", info["models"][0]["id"],
                       info["models"][0]["path"], [w["metrics"] for w in info["workers"]])
        return
    from mmlens.demo.cluster import Cluster, ClusterConfig

    worker_mode = target.mm_processing == "worker"

    def make_smg() -> Cluster:
        span = 10 + 10 * target.workers + 10
        return Cluster(ClusterConfig(
            family=MODEL_FAMILY, workers=target.workers, port_base=free_port_base(span),
            mm_processing=target.mm_processing, worker_mm_processor=worker_mode,
            num_blocks=target.num_blocks, ready_timeout=120.0, smg_log_level="info",
            log_dir=log_dir))

    with started(make_smg) as smg:
        info = smg.ready_info()
        yield Live(info["router"], "smg", info["models"][0]["id"], info["models"][0]["path"],
                   [w["metrics"] for w in info["workers"]])


def engine_counters(metrics: Sequence[str]) -> tuple[float, float]:
    """(prefix-cache hit tokens, queried tokens) summed over the engines."""
    hits = queries = 0.0
    for url in metrics:
        text = httpx.get(url, timeout=10).text
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "vllm:prefix_cache_hits_total":
                    hits += s.value
                elif s.name == "vllm:prefix_cache_queries_total":
                    queries += s.value
    return hits, queries


def mixed_workload(n: int, rate: float, seed: int, model: str) -> Plan:
    """The recorded workload, as a plan the replay sender sends (arrivals, texts, images)."""
    rnd = random.Random(seed)
    images = [PlannedImage(f"live-{w}x{h}-{k}", w, h) for w, h in SIZES
              for k in range(IMAGES_PER_SIZE)]
    rnd.shuffle(images)  # popularity independent of size
    texts = [f"Tell me about {topic}. " + " ".join([FILLER] * (1 + i % 5))
             for i, topic in enumerate(TOPICS)]

    def popular(pool: Sequence[Any]) -> Any:
        return rnd.choices(pool, weights=[1 / (r + 1) for r in range(len(pool))])[0]

    out: list[PlannedRequest] = []
    t = 0.0
    for i in range(n):
        if i:
            t += rnd.expovariate(rate)
        if rnd.random() < 0.3:
            text, imgs = popular(texts), ()
        else:
            count = 2 if rnd.random() < 0.15 else 1
            imgs = tuple(popular(images) for _ in range(count))
            text = rnd.choice(QUESTIONS)
        out.append(PlannedRequest(
            source_id=f"live-{i}", offset_s=t, model=model, images=imgs, text=text,
            text_source="stored", prompt_tokens=0, fitted_tokens=0,
            max_tokens=rnd.randint(8, 32), recorded_prompt=None, recorded_cached=None,
            recorded_worker=None))
    return Plan(out, 1.0, t)


def send(live: Live, the_plan: Plan, db: Path | None, concurrency: int, name: str,
         ) -> tuple[Measured, list[Outcome]]:
    """Send ``the_plan`` to ``live`` (traced into ``db``; untraced without one: the trace
    sink's layout work is most of the sender's CPU) and measure its hit rate. The
    synthetic images are made before the clock starts (making an 800×600 PNG holds the
    interpreter long enough to put a recording seconds behind its schedule)."""
    for p in the_plan.requests:
        for im in p.images:
            cached_identity_png(im.identity, im.width, im.height)
    h0, q0 = engine_counters(live.metrics)
    sink = TraceSink(store_writer(db), layout_model=live.model_dir) if db else None
    cpu0 = time.process_time()
    with httpx.Client() as client:
        outcomes, elapsed = Replayer(client, sink=sink, concurrency=concurrency).send_all(
            the_plan, live.url, router_kind=live.kind)
    cpu = time.process_time() - cpu0
    h1, q1 = engine_counters(live.metrics)
    served = [o for o in outcomes if o.ok]
    errors: dict[str, int] = {}
    for o in outcomes:
        if not o.ok:
            errors[o.error_code or f"http_{o.status}"] = errors.get(
                o.error_code or f"http_{o.status}", 0) + 1
    workers: dict[str, int] = {}
    for o in served:
        workers[o.worker or "unknown"] = workers.get(o.worker or "unknown", 0) + 1
    return Measured(
        target=name, sent=len(outcomes), ok=len(served),
        engine_hit_rate=(h1 - h0) / (q1 - q0) if q1 > q0 else None,
        usage_hit_rate=hit_rate([(o.cached_tokens, o.prompt_tokens) for o in served]),
        engine_prompt_tokens=int(q1 - q0), workers=workers, errors=errors,
        elapsed_s=elapsed, cpu_s=cpu), outcomes


def replay_plan(db: Path, model_dir: str) -> Plan:
    """`mmlens replay`'s plan of everything recorded in ``db`` (no text was stored)."""
    reader = open_reader(db)
    try:
        span = reader.trace_span()
        assert span is not None, "nothing recorded"
        traces = reader.window_traces(*span)
    finally:
        reader.close()
    return plan(workload(traces, {}), TextFitter(resolve_model(model_dir)))


@dataclass
class Report:
    recorded: Measured
    replays: list[Measured]
    predicted: dict[str, float | None]
    planned: int
    skipped: dict[str, int]
    approximations: dict[str, int]
    load_before: float
    load_after: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        def pct(v: float | None) -> str:
            return "-" if v is None else f"{100 * v:.2f}%"

        rows = [f"load average {self.load_before:.1f} -> {self.load_after:.1f}; planned "
                f"{self.planned}, skipped {self.skipped or 0}, approximated "
                f"{self.approximations or 0}",
                "| run | sent | ok | predicted | measured (engines) | predicted - measured |"
                " measured (usage) | requests per worker |",
                "|---|---|---|---|---|---|---|---|"]
        for m in [self.recorded, *self.replays]:
            guess = self.predicted.get(m.target)
            off = (None if guess is None or m.engine_hit_rate is None
                   else 100 * (guess - m.engine_hit_rate))
            rows.append(f"| {m.target} | {m.sent} | {m.ok} | {pct(guess)} | "
                        f"{pct(m.engine_hit_rate)} | {'-' if off is None else f'{off:+.2f} pt'} "
                        f"| {pct(m.usage_hit_rate)} | {sorted(m.workers.values())} |")
        return rows

    def error_pt(self, target: str) -> float | None:
        """Predicted minus measured hit rate for ``target``, in points."""
        m = next((r for r in self.replays if r.target == target), None)
        guess = self.predicted.get(target)
        if m is None or guess is None or m.engine_hit_rate is None:
            return None
        return 100 * (guess - m.engine_hit_rate)


def _together(names: Sequence[str], table: dict[str, Target],
              replay: Callable[[str, Live], Measured]) -> list[Measured]:
    """Each target in a thread of its own from start to stop (the demo's processes die with
    the thread that started them: PR_SET_PDEATHSIG), all sending once every one started."""
    ready = threading.Barrier(len(names))

    def one(name: str) -> Measured:
        try:
            with running(table[name]) as live:
                ready.wait()
                return replay(name, live)
        finally:
            ready.abort()  # a target that failed to start releases the others' wait

    with ThreadPoolExecutor(len(names), thread_name_prefix="whatif-live") as pool:
        futures = [pool.submit(one, name) for name in names]
    return [f.result() for f in futures]


def run(n: int, rate: float, num_blocks: int, names: Sequence[str], seed: int, keep: Path,
        concurrency: int = 16, parallel: bool = True, trace_replays: bool = False) -> Report:
    """With ``parallel``, the replay targets' clusters start together and then all get the
    recorded window at once (each its own engines and ports); else one after another. With
    ``trace_replays`` each replay is stored too (``replay-TARGET.db``), for reading which
    requests a model got wrong."""
    table = targets(num_blocks)
    load0 = os.getloadavg()[0]
    rec_db = keep / "recorded.db"
    with running(table["smg-router"]) as live:
        recorded, _ = send(live, mixed_workload(n, rate, seed, live.model), rec_db,
                           concurrency, "recorded (smg-router)")
        model_dir = live.model_dir
    the_plan = replay_plan(rec_db, model_dir)
    predicted = predict(rec_db, num_blocks, names)

    def replay(name: str, live: Live) -> Measured:
        db = keep / f"replay-{name}.db" if trace_replays else None
        return send(live, the_plan, db, concurrency, name)[0]

    if parallel:
        replays = _together(names, table, replay)
    else:
        replays = []
        for name in names:
            with running(table[name]) as live:
                replays.append(replay(name, live))
    return Report(recorded, replays, predicted, len(the_plan.requests), the_plan.skipped,
                  the_plan.approximations, load0, os.getloadavg()[0])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=320)
    p.add_argument("--rate", type=float, default=6.0, help="arrivals per second")
    p.add_argument("--num-blocks", type=int, default=512, help="KV blocks per engine")
    p.add_argument("--targets", default="smg-router,smg-worker,dynamo-kv,smg-half")
    p.add_argument("--seed", type=int, default=24)
    p.add_argument("--keep", type=Path,
                   help="keep the stores here: the recording's and each replay's")
    p.add_argument("--sequential", action="store_true",
                   help="replay to one target after another (default: all at once)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    names = [t for t in args.targets.split(",") if t]
    with contextlib.ExitStack() as stack:
        keep = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        keep.mkdir(parents=True, exist_ok=True)
        report = run(args.requests, args.rate, args.num_blocks, names, args.seed, keep,
                     parallel=not args.sequential, trace_replays=args.keep is not None)
    print(json.dumps(report.to_json()) if args.json else "\n".join(report.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
