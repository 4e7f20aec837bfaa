"""The PromQL path against real Prometheus-compatible servers (Debian packages `prometheus` and
`victoria-metrics`) scraping recorded router outputs served on loopback: it must agree with the
direct-scrape path on both."""

from __future__ import annotations

import math
import shutil
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from mmlens.collectors.metrics_scrape import MetricsScraper
from mmlens.collectors.prometheus_source import PromQLSource

from mmlens.ingest.metrics_normalize import normalize_samples
from tests.collectors.loopback import Loopback, Route
from tests.fixtures_path import capture
from tests.live_support import free_port, wait_until
from tests.servers import prometheus_server, victoria_metrics_server, wait_scraped

pytestmark = pytest.mark.slow


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


# VictoriaMetrics stores each value as a decimal of 12 significant digits (lossy by design,
# measured here: a histogram's sum comes back 1e-13 off, so a mean 0.5128205128205128 reads
# 0.5128205128204615); values from it are compared to a relative 1e-11. Prometheus keeps the
# exact float64 and is compared exactly.
TSDBS = {"prometheus": (prometheus_server, "prometheus", 0.0),
         "victoria-metrics": (victoria_metrics_server, "victoria-metrics", 1e-11)}


@dataclass(frozen=True)
class Served:
    url: str
    rel: float

    def same(self, a: Any, b: Any) -> bool:
        """``a`` equals ``b``, floats within the TSDB's relative precision."""
        if isinstance(a, float) and isinstance(b, float):
            return a == b or math.isclose(a, b, rel_tol=self.rel, abs_tol=0.0)
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(self.same(a[k], b[k]) for k in a)
        if isinstance(a, list | tuple) and isinstance(b, list | tuple):
            return len(a) == len(b) and all(self.same(x, y) for x, y in zip(a, b, strict=True))
        return bool(a == b)


@pytest.fixture(scope="module", params=sorted(TSDBS))
def prometheus(request, served):
    """A real Prometheus-compatible TSDB scraping the served outputs every second: the PromQL
    path must give the same results on Prometheus and on VictoriaMetrics."""
    start, binary, rel = TSDBS[request.param]
    if shutil.which(binary) is None:
        pytest.skip(f"{binary} not installed (scripts/test installs it when run as root)")
    jobs = "".join(
        f"  - job_name: {name}\n    scrape_interval: 1s\n    metrics_path: /{name}/metrics\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{served.port}']}}]\n"
        for name in ("smg", "dyn", "worker"))
    with start(f"global:\n  scrape_interval: 1s\nscrape_configs:\n{jobs}") as tsdb:
        wait_scraped(tsdb.url, 3)
        yield Served(tsdb.url, rel)


def test_promql_instant_agrees_with_direct_scrape(prometheus, served) -> None:
    from prometheus_api_client import PrometheusConnect

    prom = PrometheusConnect(url=prometheus.url, disable_ssl=True)
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
    same = prometheus.same
    assert same(a.cache_aware_branches, b.cache_aware_branches)
    assert same(a.dynamo, b.dynamo), (a.dynamo, b.dynamo)
    assert same(a.kv_event_health, b.kv_event_health)
    assert a.flavors == b.flavors == {"dyn": ["dynamo_frontend"], "smg": ["smg"]}
    assert same([(h.worker, h.hit_rate) for h in a.hit_rates],
                [(h.worker, h.hit_rate) for h in b.hit_rates])
    # Every sample the normalizer may read is present on both paths with equal values.
    key = {(s.target, s.name, s.labels): s.value for s in direct}
    assert same([s.value for s in promql], [key[(s.target, s.name, s.labels)] for s in promql])
    assert len(promql) == len(direct)


def test_promql_range_rate_with_counter_reset(prometheus, served) -> None:
    from prometheus_api_client import PrometheusConnect

    prom = PrometheusConnect(url=prometheus.url, disable_ssl=True)
    src = PromQLSource(prom, {f"127.0.0.1:{served.port}": "w1"})

    def restarted_and_grown() -> bool:
        res = prom.custom_query('vllm:prefix_cache_queries_total{job="worker"}')
        return bool(res) and float(res[0]["value"][1]) >= 12 and served_scrapes(served) > 8

    wait_until(restarted_and_grown, 30, 0.5, what="the worker restarted once and grew again")
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
