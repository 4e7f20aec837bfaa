"""Helpers for the Dynamo tests: a running demo cluster on free ports, the frontend's JSON log
read through mmlens' own collectors, and listener checks."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mmlens.collectors.log_follow import LogFollower
from mmlens.demo.dynamo_cluster import (
    DynamoCluster,
    DynamoClusterConfig,
    dynamo_available,
    ports_needed,
)

from mmlens.ingest.router_logs import parse_lines
from mmlens.records import RequestTrace, RoutingDecision
from mmlens.store.decisions import attach
from tests.live_support import free_port_base, started, wait_until

UNAVAILABLE = dynamo_available()
# The marks of a module whose tests start the real Dynamo frontend: skipped without the extra.
LIVE_DYNAMO = [pytest.mark.live, pytest.mark.dynamo,
               pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))]


def free_config(**kwargs: Any) -> DynamoClusterConfig:
    """A config whose ports are all free, below the ephemeral range (32768+)."""
    base = free_port_base(ports=lambda b: ports_needed(DynamoClusterConfig(port_base=b, **kwargs)))
    return DynamoClusterConfig(port_base=base, **kwargs)


@contextlib.contextmanager
def running_dynamo(**kwargs: Any) -> Iterator[DynamoCluster]:
    with started(lambda: DynamoCluster(free_config(**kwargs))) as cluster:
        yield cluster


def frontend_decisions(log: Path, errors: dict[str, int] | None = None,
                       ) -> list[RoutingDecision]:
    """Every routing decision mmlens parses from the frontend's JSON log so far."""
    return parse_lines(LogFollower(str(log)).read_new(), errors)


def decisions_for(cluster: DynamoCluster, trace: RequestTrace,
                  need: tuple[str, ...] = ("log:routing_best",)) -> list[RoutingDecision]:
    """Join the frontend log into the trace (waiting for the lines `need` names)."""

    def probe() -> list[RoutingDecision] | None:
        ds = frontend_decisions(cluster.frontend_log)
        trace.predictions = [p for p in trace.predictions if not p.source.startswith("log:")]
        attach([trace], ds)
        have = {p.source for p in trace.predictions}
        return trace.predictions if all(n in have for n in need) else None

    return wait_until(probe, 10.0, what=f"{need} in the frontend log for {trace.request_id}")


def one(trace: RequestTrace, source: str) -> RoutingDecision:
    """The trace's only decision from `source`."""
    found = [p for p in trace.predictions if p.source == source]
    assert len(found) == 1, (source, trace.predictions)
    return found[0]


def worker_requests(cluster: DynamoCluster) -> list[dict[str, Any]]:
    """The simulated workers' own per-request records, from their logs."""
    return [json.loads(line) for w in cluster.workers
            for line in w.log_path.read_text(errors="replace").splitlines()
            if line.startswith('{"event": "request"')]


def listeners(pids: Iterable[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every listening TCP socket owned by `pids` (from `ss`)."""
    wanted = set(pids)
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        cols = line.split()
        if len(cols) < 4:
            continue
        addr, _, port = cols[3].rpartition(":")
        for pid in map(int, re.findall(r"pid=(\d+)", line)):
            if pid in wanted:
                found.append((addr.strip("[]"), int(port), pid))
    return found


def running_requests(cluster: DynamoCluster) -> float:
    """Requests the simulated engines are running now (their `vllm:num_requests_running`)."""
    import httpx

    total = 0.0
    for w in cluster.ready_info()["workers"]:
        with contextlib.suppress(httpx.HTTPError):
            for line in httpx.get(w["metrics"], timeout=1.0).text.splitlines():
                if line.startswith("vllm:num_requests_running{"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def applied_stored(cluster: DynamoCluster) -> float:
    """Stored-block events the frontend's KV index has applied so far (its
    `dynamo_component_kv_cache_events_applied{event_type="stored",status="ok"}`)."""
    import httpx

    from mmlens.ingest.exposition import parse_exposition

    text = httpx.get(cluster.ready_info()["router_metrics"], timeout=5.0).text
    return sum(s.value for s in parse_exposition(text, "frontend", 0.0)
               if s.name == "dynamo_component_kv_cache_events_applied"
               and s.label("event_type") == "stored" and s.label("status") == "ok")


def wait_router_indexed(cluster: DynamoCluster, before: float, timeout: float = 15.0) -> float:
    """Until the frontend's KV index has applied stored-block events beyond `before` (a count
    taken before the requests) and no more arrived over three polls: what those requests
    stored is in the router's index. Returns the count."""
    seen: list[float] = []

    def settled() -> float | None:
        seen.append(applied_stored(cluster))
        if seen[-1] > before and len(seen) >= 3 and seen[-1] == seen[-3]:
            return seen[-1]
        return None

    return wait_until(settled, timeout, 0.2, what="the router's KV index caught up")


def overlapping_seeds(send_a: Callable[[], Any], send_b: Callable[[], Any],
                      cluster: DynamoCluster) -> tuple[Any, Any]:
    """Send seed B while seed A is still running on its engine, so the router's load
    accounting (not a random tie-break) decides where B goes."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        fa = pool.submit(send_a)
        wait_until(lambda: running_requests(cluster) >= 1 or fa.done(), 10.0,
                   what="seed A running")
        fb = pool.submit(send_b)
        return fa.result(), fb.result()
