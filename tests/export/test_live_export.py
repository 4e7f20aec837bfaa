"""The whole path on real servers: the demo (real SMG 1.13, two simulated vLLM workers, a
router-mode and a worker-mode router, workers drifting image counts by 8 tokens), two `mmlens
collect --shard I/2 --metrics-port` processes on one store as users run them (one worker
each), a real Prometheus scraping both every second with the shipped rule file, and a real
Alertmanager (Debian ``prometheus-alertmanager``) on loopback.

Drives content-blind false hits (same-size images of other colours through the router-mode
router) and a count drift (the worker-mode router), then checks PromQL against `mmlens
snapshot --json`, the alerts in Prometheus and in Alertmanager, and that every Grafana panel's
query returns data; then stops shard 1 and sees it reported down."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from mmlens.collectors.trace_sink import TraceSink
from mmlens.collectors.traces import ImagePart, TraceClient, solid_png

from mmlens.cli import snapshot as snapshot_cli
from mmlens.shard import shard_of
from mmlens.store.sqlite import Store
from tests.live_support import LOOPBACK, demo_process, free_port, free_port_base, stop_process
from tests.servers import prometheus_server, wait_for

pytestmark = [pytest.mark.live, pytest.mark.slow,
              pytest.mark.skipif(not (shutil.which("prometheus")
                                      and shutil.which("prometheus-alertmanager")),
                                 reason="prometheus / prometheus-alertmanager not installed")]

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "mmlens-rules.yml"
DRIFT = 8
TEXT = "Describe this image in detail please."
EXPECTED_ALERTS = {"MmlensFalseHitRateHigh", "MmlensCountDrift"}


@contextlib.contextmanager
def alertmanager() -> Iterator[str]:
    root = Path(tempfile.mkdtemp(prefix="mmlens-am-"))
    (root / "am.yml").write_text("route:\n  receiver: log\nreceivers:\n  - name: log\n")
    port = free_port()
    proc = subprocess.Popen(
        ["prometheus-alertmanager", f"--config.file={root / 'am.yml'}",
         f"--storage.path={root / 'data'}", f"--web.listen-address={LOOPBACK}:{port}",
         "--cluster.listen-address="], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://{LOOPBACK}:{port}"
    try:
        wait_for(lambda: _ok(url + "/-/ready"), 30, "alertmanager ready",
                 lambda: proc.poll() is None)
        yield url
    finally:
        stop_process(proc, signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def query(prom: str, expr: str) -> list[dict]:
    r = httpx.get(prom + "/api/v1/query", params={"query": expr}, timeout=5)
    r.raise_for_status()
    return r.json()["data"]["result"]


def scalar_by(prom: str, expr: str, label: str) -> dict[str, float]:
    return {s["metric"].get(label, ""): float(s["value"][1]) for s in query(prom, expr)}


def snapshot(db: Path, capsys) -> dict:
    capsys.readouterr()
    assert snapshot_cli.main(["--db", str(db), "--json", "--traces", "100000",
                              "--window", "1e10", "--availability-window", "1e10"]) == 0
    return json.loads(capsys.readouterr().out)


def split_base() -> int:
    """A demo port base whose two workers (gRPC at BASE+10 and BASE+20) fall in different
    shards of two."""
    for _ in range(50):
        base = free_port_base(50)
        if len({shard_of(f"grpc://{LOOPBACK}:{base + i}", 2) for i in (10, 20)}) == 2:
            return base
    raise RuntimeError("no port base splits the workers")


def test_prometheus_alertmanager_and_dashboards_on_the_demo(tmp_path, capsys) -> None:
    ready = tmp_path / "ready.json"
    demo_args = ["--port-base", str(split_base()), "--worker-mode-router",
                 "--count-drift", str(DRIFT), "--log-dir", str(tmp_path / "logs"),
                 "--smg-log-level", "debug"]
    rules = tmp_path / "rules.yml"
    # The shipped rules with their hold times at 0 s: the test has seconds, not minutes.
    text = RULES.read_text()
    rules.write_text(text.replace("for: 10m", "for: 0s").replace("for: 5m", "for: 0s")
                     .replace("for: 2m", "for: 0s").replace("for: 1m", "for: 0s"))
    assert "for: 0s" in rules.read_text() and "for: 5m" in text
    db = tmp_path / "live.db"
    ports = [free_port(), free_port()]
    with demo_process(demo_args, ready) as info, alertmanager() as am:
        # Requests judged 3 s after they end, not 12: loopback logs and KV events are in by
        # then (a verdict is judged again if something comes later).
        (tmp_path / "mmlens.toml").write_text(
            f'interval_s = 1\nsettle_s = 3\n[demo]\nready_file = "{ready}"\n')
        # A second log to follow whose line was cut off mid-object: a parse error by kind.
        (tmp_path / "cut.log").write_text(
            '{"timestamp":"2026-12-01T00:00:00.000000Z","level":"DEBUG","fields":{"mes\n')
        shards = [subprocess.Popen(
            [sys.executable, "-m", "mmlens", "collect", "--config", str(tmp_path / "mmlens.toml"),
             "--db", str(db), "--shard", f"{i}/2", "--metrics-port", str(port),
             "--router-log", f"cut={tmp_path / 'cut.log'}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i, port in enumerate(ports)]
        targets = ", ".join(f"'{LOOPBACK}:{p}'" for p in ports)
        scrape = (f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                  f"rule_files: ['{rules}']\n"
                  f"alerting:\n  alertmanagers:\n    - static_configs:\n"
                  f"        - targets: ['{am.removeprefix('http://')}']\n"
                  f"scrape_configs:\n  - job_name: mmlens\n    static_configs:\n"
                  f"      - targets: [{targets}]\n")
        try:
            with prometheus_server(scrape, ["--enable-feature=exemplar-storage"]) as prom:
                run(info, db, prom.url, am, capsys)
                # Shard 1 stops: its target is down, and Alertmanager hears of it.
                stop_process(shards[1], signal.SIGTERM)
                wait_for(lambda: "MmlensCollectorDown" in received(am), 30,
                         "MmlensCollectorDown received")
                down = [a for a in alerts(am) if a["labels"]["alertname"] == "MmlensCollectorDown"]
                assert {a["labels"]["instance"] for a in down} == {f"{LOOPBACK}:{ports[1]}"}
        finally:
            for proc in shards:
                stop_process(proc, signal.SIGTERM)
    for proc in shards:
        assert proc.returncode == 0, proc.stderr.read().decode() if proc.stderr else ""


def alerts(am: str) -> list[dict]:
    return httpx.get(am + "/api/v2/alerts", timeout=5).json()


def received(am: str) -> set[str]:
    return {a["labels"]["alertname"] for a in alerts(am)}


def send_alone(db: Path, router: str, model: str, rgb: tuple[int, int, int]) -> None:
    """One traced request on its own client and store connection (for a thread)."""
    store = Store(db)
    try:
        t = TraceClient(httpx.Client(), sink=TraceSink(store.add_traces,
                                                       layout_model="qwen3-vl")).send(
            router, model, TEXT, [ImagePart(solid_png(64, 64, rgb))], router_kind="smg")
    finally:
        store.close()
    assert t.status == 200, t.error


def run(info: dict, db: Path, prom: str, am: str, capsys) -> None:
    wait_for(lambda: len(query(prom, "mmlens_exporter_store_up == 1")) == 2, 30,
             "prometheus scrapes both shards")
    routers = {r["mm_processing"]: r["url"] for r in info["routers"]}
    model = info["models"][0]["id"]

    def send(router: str, rgb: tuple[int, int, int]) -> None:
        send_alone(db, router, model, rgb)

    def scraped(n: int) -> None:
        wait_for(lambda: sum(scalar_by(prom, "sum(mmlens_requests_total)", "").values()) >= n,
                 30, f"{n} requests scraped")

    # Alerts evaluated by Prometheus from the shipped rules, and received by Alertmanager.
    def firing() -> set[str]:
        alerts = httpx.get(prom + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        return {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}

    red = (200, 30, 30)
    for _ in range(3):  # a seed and two hits: every worker's series exist before the faults
        send(routers["router"], red)
    scraped(3)
    # Healthy so far: once judged, evaluated and past a few rule evaluations, nothing fires
    # (hold times are 0 s here).
    wait_for(lambda: not query(prom, 'sum(mmlens_requests_total{verdict="pending"}) > 0')
             and bool(query(prom, "sum(mmlens_evaluated_requests_total) >= 3")), 40,
             "the healthy requests judged and evaluated")
    time.sleep(3)
    assert firing() == set()
    # Worker mode (the engines count 8 tokens more), two at once: SMG places them by load,
    # one per worker, so both workers hold blocks and both shards have views to export.
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: send(routers["worker"], red), range(2)))
    for rgb in ((30, 30, 200), (200, 200, 30), (30, 200, 200)):
        send(routers["router"], rgb)  # same size, other content: SMG predicts red's blocks
    for _ in range(2):
        send(routers["worker"], red)
    scraped(10)

    wait_for(lambda: EXPECTED_ALERTS <= firing(), 60, "alerts firing in Prometheus")

    wait_for(lambda: EXPECTED_ALERTS <= received(am), 30, "alerts received by Alertmanager")
    drift = [a for a in alerts(am) if a["labels"]["alertname"] == "MmlensCountDrift"]
    assert {a["labels"]["router"] for a in drift} == {routers["worker"]}

    # PromQL returns what `mmlens snapshot --json` computes, once the logs are joined.
    def same() -> bool:
        snap = snapshot(db, capsys)
        verdicts = {k: v for k, v in snap["observed"]["verdicts"].items() if v}
        got = {k: v for k, v in scalar_by(
            prom, "sum by (verdict) (mmlens_requests_total)", "verdict").items() if v}
        avail = snap["availability"]
        tokens = scalar_by(prom, "sum(mmlens_false_hit_tokens_total)", "")
        prompt = scalar_by(prom, "sum(mmlens_evaluated_prompt_tokens_total)", "")
        return (avail["requests"] == 10 and "pending" not in got and got == verdicts
                and tokens.get("", 0) == avail["false_hit_tokens"]
                and prompt.get("", 0) == avail["prompt_tokens"])

    wait_for(same, 60, "every request judged and evaluated, PromQL equal to snapshot --json")
    snap = snapshot(db, capsys)
    assert snap["observed"]["verdicts"]["false_hit"] >= 2
    assert snap["observed"]["verdicts"]["count_drift"] == 4
    assert snap["availability"]["false_hit_tokens"] > 0
    drift_tokens = scalar_by(prom, "sum by (router) (mmlens_count_drift_tokens_total)",
                             "router")
    assert drift_tokens[routers["worker"]] == 4 * DRIFT  # four worker-mode requests
    assert drift_tokens.get(routers["router"], 0) == 0

    # Each worker's requests are in one shard's scrape only, and the lead sees both shards.
    per = query(prom, "sum by (instance, worker) (mmlens_requests_total) > 0")
    owners: dict[str, set[str]] = {}
    for sample in per:
        owners.setdefault(sample["metric"]["worker"], set()).add(sample["metric"]["instance"])
    assert owners and all(len(v) == 1 for v in owners.values()), owners
    assert set(scalar_by(prom, "mmlens_shard_last_tick_timestamp_seconds", "shard")) == {
        "0/2", "1/2"}
    errors = scalar_by(prom, 'mmlens_collector_errors_total{collector="router_logs",'
                       'target="cut"}', "kind")
    assert errors.get("malformed_log_line", 0) >= 1, errors

    # The false-hit series' exemplars are false-hit requests (the Grafana link's request ids).
    judged = {t["request_id"]: (t["verdict"] or {}).get("category") for t in snap["traces"]}
    r = httpx.get(prom + "/api/v1/query_exemplars", timeout=5, params={
        "query": 'mmlens_requests_total{verdict="false_hit"}', "start": "0",
        "end": str(time.time() + 60)})
    ids = {e["labels"]["request_id"] for s in r.json()["data"] for e in s["exemplars"]}
    assert ids and all(judged[i] == "false_hit" for i in ids), (ids, judged)

    # Every Grafana panel's query has data on this Prometheus.
    from mmlens.export import grafana

    empty = []
    for uid in grafana.DASHBOARDS:
        for title, expr in grafana.queries(grafana.build(uid)):
            promql = expr.replace("$__rate_interval", "1m").replace("$__range", "10m")
            if not query(prom, promql):
                empty.append((uid, title, promql))
    assert not empty, empty
