"""The PromQL path against a real Prometheus server (Debian package `prometheus`) scraping
recorded router outputs served on loopback: it must agree with the direct-scrape path."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from mmlens.collectors.metrics_scrape import MetricsScraper
from mmlens.collectors.prometheus_source import PromQLSource

from mmlens.ingest.metrics_normalize import normalize_samples
from tests.collectors.loopback import Loopback, Route
from tests.fixtures_path import capture
from tests.live_support import free_port

pytestmark = pytest.mark.slow
PROMETHEUS = shutil.which("prometheus")


class CountingWorker:
    """A vLLM worker whose prefix-cache counters grow 3/4 per scrape and reset once."""

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def body(self) -> str:
        with self.lock:
            self.n += 1
            n = self.n if self.n <= 6 else self.n - 6  # restart after the 6th scrape
        return ("# TYPE vllm:prefix_cache_hits counter\n"
                f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {3 * n}\n'
                "# TYPE vllm:prefix_cache_queries counter\n"
                f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {4 * n}\n')


@pytest.fixture(scope="module")
def served():
    worker = CountingWorker()
    routes = {"/smg/metrics": Route(capture("smg_grpc_metrics_kv.txt")),
              "/dyn/metrics": Route(capture("dyn_frontend_metrics_text.txt")),
              "/worker/metrics": Route(worker.body)}
    with Loopback(routes) as lb:
        yield lb


@pytest.fixture(scope="module")
def prometheus(served, tmp_path_factory):
    if PROMETHEUS is None:
        pytest.skip("prometheus not installed (scripts/test installs it when run as root)")
    tmp: Path = tmp_path_factory.mktemp("prom")
    jobs = "".join(
        f"  - job_name: {name}\n    scrape_interval: 1s\n    metrics_path: /{name}/metrics\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{served.port}']}}]\n"
        for name in ("smg", "dyn", "worker"))
    (tmp / "prometheus.yml").write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n{jobs}")
    port = free_port()
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, "prometheus exited"
            try:
                r = httpx.get(url + "/api/v1/query", params={"query": "sum(up)"}, timeout=1)
                res = r.json()["data"]["result"]
                if res and float(res[0]["value"][1]) == 3:
                    break
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            assert time.monotonic() < deadline, "prometheus did not scrape all targets"
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_promql_instant_agrees_with_direct_scrape(prometheus, served) -> None:
    from prometheus_api_client import PrometheusConnect

    prom = PrometheusConnect(url=prometheus, disable_ssl=True)
    promql = []
    for job in ("smg", "dyn"):
        src = PromQLSource(prom, {f"127.0.0.1:{served.port}": job})
        promql += src.instant(
            f'{{job="{job}",__name__=~"smg_.+|dynamo_.+"}}')
        assert src.health.errors == {}
    with httpx.Client() as client:
        scraper = MetricsScraper(client)
        direct = scraper.scrape_all([("smg", served.url + "/smg/metrics"),
                                     ("dyn", served.url + "/dyn/metrics")])
        scraper.close()
    a, b = normalize_samples(promql), normalize_samples(direct)
    for field in ("mm_processing", "worker_requests"):
        assert [(r["target"], r.get("mode"), r.get("worker"), r["count"]) for r in getattr(a, field)
                ] == [(r["target"], r.get("mode"), r.get("worker"), r["count"])
                      for r in getattr(b, field)], field
    assert a.cache_aware_branches == b.cache_aware_branches
    assert a.dynamo == b.dynamo
    assert a.kv_event_health == b.kv_event_health
    assert a.flavors == b.flavors == {"dyn": ["dynamo_frontend"], "smg": ["smg"]}
    assert [(h.worker, h.hit_rate) for h in a.hit_rates] == [
        (h.worker, h.hit_rate) for h in b.hit_rates]
    # Every sample the normalizer may read is present on both paths with equal values.
    key = {(s.target, s.name, s.labels): s.value for s in direct}
    assert all(key[(s.target, s.name, s.labels)] == s.value for s in promql)
    assert len(promql) == len(direct)


def test_promql_range_rate_with_counter_reset(prometheus, served) -> None:
    from prometheus_api_client import PrometheusConnect

    prom = PrometheusConnect(url=prometheus, disable_ssl=True)
    src = PromQLSource(prom, {f"127.0.0.1:{served.port}": "w1"})
    deadline = time.monotonic() + 30
    while True:  # wait until the worker has restarted once and grown again
        res = prom.custom_query('vllm:prefix_cache_queries_total{job="worker"}')
        if res and float(res[0]["value"][1]) >= 12 and served_scrapes(served) > 8:
            break
        assert time.monotonic() < deadline
        time.sleep(0.5)
    end = datetime.now(UTC)
    samples = src.range('{job="worker",__name__=~"vllm:prefix_cache_.+"}',
                        end - timedelta(seconds=60), end, step="1s")
    (hr,) = normalize_samples(samples).hit_rates
    assert hr.rate == pytest.approx(0.75)
    assert hr.queries_increase > 0 and hr.cumulative_rate == pytest.approx(0.75)
    # Prometheus' own increase() ratio (it also treats the drop as a reset) agrees.
    server = prom.custom_query(
        'sum(increase(vllm:prefix_cache_hits_total{job="worker"}[60s])) / '
        'sum(increase(vllm:prefix_cache_queries_total{job="worker"}[60s]))')
    assert float(server[0]["value"][1]) == pytest.approx(hr.rate)


def served_scrapes(served) -> int:
    return sum(1 for _, path, _, _ in served.requests if path.startswith("/worker"))


def test_promql_errors_are_counted() -> None:
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    src = PromQLSource(PrometheusConnect(url=f"http://127.0.0.1:{free_port()}", disable_ssl=True,
                                         retry=Retry(total=1, backoff_factor=0.1)), timeout_s=1)
    t0 = time.monotonic()
    assert src.instant() == []
    assert src.health.errors == {"promql_error": 1}
    assert time.monotonic() - t0 < 2
