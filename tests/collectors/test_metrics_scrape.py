"""Direct scrapes: real captures through MockTransport, bad targets on a loopback server."""

from __future__ import annotations

import time

import httpx
from mmlens.collectors.metrics_scrape import MetricsScraper

from mmlens.ingest.metrics_normalize import normalize_samples
from tests.collectors.loopback import Loopback, Route
from tests.fixtures_path import capture


def _mock(routes: dict[str, tuple[int, str, str]]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        status, ctype, body = routes[request.url.host]
        return httpx.Response(status, headers={"content-type": ctype}, text=body)

    return httpx.Client(transport=httpx.MockTransport(handler))


def test_captures_through_mock_transport() -> None:
    client = _mock({
        "smg": (200, "text/plain", capture("smg_grpc_metrics_kv.txt")),
        "dyn": (200, "text/plain", capture("dyn_frontend_metrics_text.txt")),
    })
    scraper = MetricsScraper(client)
    samples = scraper.scrape_all([("smg", "http://smg/metrics"), ("dyn", "http://dyn/metrics")])
    n = normalize_samples(samples)
    assert n.flavors == {"dyn": ["dynamo_frontend"], "smg": ["smg"]}
    assert n.cache_aware_branches["smg"] == {"event_hit": 5.0, "event_miss": 1.0}
    assert scraper.health["smg"].errors == {} and scraper.health["smg"].last_success
    assert scraper.health["dyn"].counters["last_samples"] == 764
    scraper.close()


def test_bad_answers_are_counted_by_kind() -> None:
    client = _mock({
        "html": (200, "text/html", "<html><body>Sign in</body></html>"),
        "sneaky": (200, "text/plain", "<!DOCTYPE html><html></html>"),
        "err": (503, "text/plain", "unavailable"),
        "junk": (200, "text/plain", "this is not { exposition\n\x00\x01\n"),
        "mixed": (200, "text/plain", "good 1\nbad{ 2\n"),
        "ok": (200, "text/plain", "smg_worker_health{worker=\"a\"} 1\n"),
    })
    scraper = MetricsScraper(client)
    samples = scraper.scrape_all([(h, f"http://{h}/metrics") for h in
                                  ("html", "sneaky", "err", "junk", "mixed", "ok")])
    assert sorted({s.target for s in samples}) == ["mixed", "ok"]
    errors = {t: h.errors for t, h in scraper.health.items()}
    assert errors["html"] == {"html_answer": 1}
    assert errors["sneaky"] == {"html_answer": 1}
    assert errors["err"] == {"http_status": 1}
    assert errors["junk"]["malformed_exposition"] >= 1
    assert errors["mixed"] == {"malformed_exposition": 1}
    assert errors["ok"] == {}
    scraper.close()


def test_hanging_and_dead_targets_do_not_block_others() -> None:
    routes = {"/fast": Route("smg_worker_health{worker=\"a\"} 1\n"),
              "/hang": Route("x 1\n", delay_s=3.0)}
    with Loopback(routes) as lb, httpx.Client() as client:
        scraper = MetricsScraper(client, timeout_s=0.5)
        t0 = time.monotonic()
        samples = scraper.scrape_all([("hang", lb.url + "/hang"), ("fast", lb.url + "/fast"),
                                      ("dead", "http://127.0.0.1:9/metrics")])
        took = time.monotonic() - t0
        scraper.close()
    assert took < 2.0
    assert [s.target for s in samples] == ["fast"]
    assert scraper.health["hang"].errors == {"timeout": 1}
    assert scraper.health["dead"].errors == {"unreachable": 1}
