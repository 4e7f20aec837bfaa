"""The Prometheus endpoint of ``mmlens collect --metrics-port``: at each scrape, the store's
answers read through ``StoreReader`` (the reads ``mmlens snapshot`` makes) and turned into
metric families by ``mmlens.export.families``.

A store that cannot be read is a scrape that says so (``mmlens_exporter_store_up 0`` and an
error counter), never an HTTP 500 or a traceback.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mmlens.export.families import ExportInputs, Part, families
from mmlens.shard import COLLECTOR as SHARD_COLLECTOR
from mmlens.store.reader import StoreReader

log = logging.getLogger("mmlens.metrics_export")

ALL_TIME_S = 1e10  # the availability cells' window: every stored minute
VIEW_WINDOW_S = 120.0  # router-vs-engine comparisons: the newest per worker within this


class StoreExport:
    """A ``prometheus_client`` collector over one store, for one collector process's part.

    ``instance``: the health rows of this process (``CollectorRunner.instance``); None
    exports every row (a reader-only exporter)."""

    def __init__(self, db: str, part: Part | None = None, instance: str | None = None,
                 open_reader: Callable[[str], Any] = StoreReader) -> None:
        self.db = db
        self.part = part or Part()
        self.instance = instance
        self._open = open_reader
        self._reader: Any = None
        self._lock = threading.Lock()  # Prometheus and a curl may scrape at once
        self.read_errors = 0

    def read(self) -> ExportInputs:
        if self._reader is None:
            self._reader = self._open(self.db)
        r = self._reader
        traces = r.trace_labels()
        cells, _ = r.availability_window(ALL_TIME_S, recent=0)
        latest = r.latest_sample_ts() or time.time()
        health = r.health()
        own = [h for h in health if self.instance is None or h.instance == self.instance]
        return ExportInputs(traces=traces, verdicts=r.verdicts_for(traces), cells=cells,
                            views=r.kv_views(latest - VIEW_WINDOW_S), health=own, part=self.part,
                            shards=[h for h in health if h.collector == SHARD_COLLECTOR])

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            started = time.perf_counter()
            try:
                out = families(self.read())
                up = 1
            except Exception as exc:  # a down or broken store is a metric, not a 500
                log.warning("metrics export: store read failed: %s", exc)
                self.read_errors += 1
                self._close_reader()
                out, up = [], 0
            out.append(GaugeMetricFamily("mmlens_exporter_store_up",
                                         "1 when the last scrape read the store", value=up))
            out.append(CounterMetricFamily("mmlens_exporter_store_read_errors",
                                           "Scrapes whose store read failed",
                                           value=self.read_errors))
            out.append(GaugeMetricFamily(
                "mmlens_exporter_read_duration_seconds",
                "Time this scrape took to read the store and build the families",
                value=time.perf_counter() - started))
        yield from out

    def describe(self) -> list[Metric]:
        return []  # no store read at registration

    def _close_reader(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(Exception):  # it is being dropped anyway
                self._reader.close()
            self._reader = None

    def close(self) -> None:
        with self._lock:
            self._close_reader()


class MetricsServer:
    """``/metrics`` on ``host:port`` (port 0: any free one) for one ``StoreExport``."""

    def __init__(self, export: StoreExport, host: str = "127.0.0.1", port: int = 0) -> None:
        self.export = export
        registry = CollectorRegistry(auto_describe=False)
        registry.register(export)
        self._server, self._thread = start_http_server(port, host, registry=registry)
        self.host = host

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self.export.close()
