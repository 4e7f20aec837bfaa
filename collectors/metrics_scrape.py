"""Direct ``/metrics`` scrapes: concurrent GETs through an injected ``httpx.Client``.

Each target is independent: a hanging, failing or HTML-answering target is counted in its own
health entry and never delays the others beyond the per-request timeout.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx

from mmlens.ingest.exposition import ExpositionParser, looks_like_html
from mmlens.records import CollectorHealth, MetricSample

MAX_BODY_BYTES = 32 * 1024 * 1024


class MetricsScraper:
    def __init__(self, client: httpx.Client, timeout_s: float = 2.0, max_workers: int = 32,
                 parser: ExpositionParser | None = None) -> None:
        self.client = client
        self.timeout = httpx.Timeout(timeout_s)
        self.parser = parser or ExpositionParser()
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="scrape")
        self.health: dict[str, CollectorHealth] = {}

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _health(self, target: str) -> CollectorHealth:
        h = self.health.get(target)
        if h is None:
            h = self.health[target] = CollectorHealth("metrics", target)
        return h

    def fetch(self, target: str, url: str) -> tuple[str, str] | None:
        """GET one target; returns ``(text, content_type)`` or None (counted in health)."""
        h = self._health(target)
        now = time.time()
        try:
            resp = self.client.get(url, timeout=self.timeout,
                                   headers={"accept": "text/plain;version=0.0.4"})
        except httpx.TimeoutException as exc:
            h.error("timeout", str(exc) or type(exc).__name__, now)
            return None
        except httpx.HTTPError as exc:
            h.error("unreachable", str(exc) or type(exc).__name__, now)
            return None
        if resp.status_code != 200:
            h.error("http_status", f"HTTP {resp.status_code}", now)
            return None
        if len(resp.content) > MAX_BODY_BYTES:
            h.error("oversize_body", f"{len(resp.content)} bytes", now)
            return None
        try:
            text = resp.content.decode("utf-8")
        except UnicodeDecodeError:
            h.error("malformed_exposition", "body is not UTF-8", now)
            return None
        ctype = resp.headers.get("content-type", "")
        if looks_like_html(text, ctype):
            h.error("html_answer", f"content-type {ctype or '?'}", now)
            return None
        return text, ctype

    def scrape_all(self, targets: Sequence[tuple[str, str]]) -> list[MetricSample]:
        """Fetch concurrently, parse on the calling thread (the parser is CPU-bound)."""
        fetched = list(self.pool.map(lambda t: (t[0], self.fetch(t[0], t[1])), targets))
        out: list[MetricSample] = []
        for target, got in fetched:
            if got is None:
                continue
            ts = time.time()
            h = self._health(target)
            errors: dict[str, int] = {}
            samples = self.parser.parse(got[0], target, ts, errors)
            for kind, n in errors.items():
                h.errors[kind] = h.errors.get(kind, 0) + n
                h.last_error, h.last_error_ts = f"{kind}: {n} bad line(s)", ts
            if not samples and got[0].strip():
                h.error("malformed_exposition", "no samples parsed", ts)
                continue
            h.ok(ts)
            h.count("scrapes")
            h.counters["last_samples"] = len(samples)
            out.extend(samples)
        return out
