"""Fleet views read rollups: the Cache page on a 20-worker store makes as many queries and reads
as many rows with four times the raw KV events and counter samples in its window, and its
hit-rate and KV-event charts name the 12 busiest workers and sum the rest."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from mmlens.ui import shared
from streamlit.testing.v1 import AppTest

from mmlens.records import CollectorHealth, ImageInfo, RequestTrace
from mmlens.store.open import open_store
from mmlens.store.postgres import PostgresStore
from mmlens.store.sqlite import Store
from tests.conftest import new_database
from tests.core.test_rollups import T0, fill, worker_urls
from tests.pages.apptest_util import APP, frames, lines_titled, metrics, svg_bars

WORKERS, MINUTES = 20, 5


class Reads:
    def __init__(self) -> None:
        self.queries = 0
        self.rows = 0


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    """Every query either backend runs, and the rows it returned."""
    reads = Reads()
    for cls in (Store, PostgresStore):
        original = cls._rows

        def counting(self: Any, sql: str, args: Any = (), _original: Any = original) -> Any:
            rows = _original(self, sql, args)
            reads.queries += 1
            reads.rows += len(rows)
            return rows

        monkeypatch.setattr(cls, "_rows", counting)
    yield reads


def _settle() -> None:
    """Wait for the reads a run started in the background (the head start's read-ahead,
    cache refreshes): counted with the run that started them, never half in the next."""
    for t in threading.enumerate():
        if t.name.startswith("mmlens-") and t is not threading.current_thread():
            t.join(timeout=60)


def _page_reads(db: str, counted: Reads, monkeypatch: pytest.MonkeyPatch,
                page: str = "cache") -> tuple[int, int, Any]:
    monkeypatch.setenv("MMLENS_DB", db)
    monkeypatch.delenv("MMLENS_CONFIG", raising=False)
    # The head start reads the newest traces ahead on its own thread: whether it or the page
    # reads them first is a race, and either way its read is the same bounded window.
    monkeypatch.setattr(shared, "load_tokenizers_soon", lambda: None)
    shared.forget_store_reads()
    shared._reader.clear()
    at = AppTest.from_file(str(APP), default_timeout=60)
    before = (counted.queries, counted.rows)
    at.run()  # the Overview first, as a visitor arrives; only ``page``'s run is counted
    _settle()
    if page != "overview":
        before = (counted.queries, counted.rows)
        at.switch_page(f"pages/{page}.py").run()
        _settle()
    assert not at.exception
    return counted.queries - before[0], counted.rows - before[1], at


def _add_images(store: Any) -> None:
    """The same image requests and resident summaries in every store: image ``k`` served by
    worker ``k % WORKERS``, and resident there and on its neighbour."""
    urls = worker_urls(WORKERS)
    images = [ImageInfo("data", 10, 64, 64, {"smg_blake3": f"{k:064x}"}) for k in range(30)]
    store.add_traces([RequestTrace(f"img-{k}", "http://r", "smg", "m", T0 + k, False,
                                   status=200, worker=urls[k % WORKERS], images=[im])
                      for k, im in enumerate(images)])
    store.set_kv_state({f"{w}#0": {"worker": w, "rank": 0, "resident_blocks": 100 + i,
                                   "images": {f"{k:064x}": 4 for k in range(30)
                                              if k % WORKERS in (i, (i - 1) % WORKERS)}}
                        for i, w in enumerate(urls)}, T0)


def _sparse_and_dense(backend: str, tmp_path: Any, request: pytest.FixtureRequest,
                      counted: Reads, monkeypatch: pytest.MonkeyPatch, page: str,
                      ) -> tuple[tuple[int, int, Any], tuple[int, int, Any]]:
    """A page's reads on a store, and on one with four times its raw events and samples."""
    def db(name: str) -> str:
        if backend == "sqlite":
            return str(tmp_path / f"{name}.db")
        return new_database(request.getfixturevalue("postgres"))

    sparse, dense = db("sparse"), db("dense")
    for path, density in ((sparse, 1), (dense, 4)):
        fill(path, WORKERS, MINUTES, density=density)
        store = open_store(path)
        try:  # the collectors' health rows: the Overview shows a store with data
            store.set_health([CollectorHealth("metrics", w, last_success=T0)
                              for w in worker_urls(WORKERS)], T0)
            _add_images(store)
        finally:
            store.close()
    return (_page_reads(sparse, counted, monkeypatch, page),
            _page_reads(dense, counted, monkeypatch, page))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_cache_page_reads_do_not_grow_with_raw_events(backend: str, tmp_path: Any,
                                                      request: pytest.FixtureRequest,
                                                      counted: Reads,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (q1, r1, at), (q4, r4, _) = _sparse_and_dense(backend, tmp_path, request, counted,
                                                  monkeypatch, "cache")
    assert q1 > 0 and r1 > 0
    assert (q4, r4) == (q1, r1)
    drawn = svg_bars(at, "Resident blocks")
    bars = [(x, y) for x, s, y in zip(drawn["x"], drawn["series"], drawn["y"], strict=True)
            if s == "resident blocks"]
    assert len(bars) == 13 and bars[-1][0] == f"{WORKERS - 12} other workers (mean)"
    assert bars[0][1] == 100 + WORKERS - 1
    # KV bars (SVG) are of series "<worker> stored (N)" / "<worker> removed (N)"
    for title, found in (("hit rate", [t["name"] for t in lines_titled(
            at, "hit rate per worker")["data"]]),
                         ("KV events", svg_bars(at, "KV events")["series"])):
        names = {re.sub(r" (stored|removed) \(\d+\)$", "", n or "") for n in found}
        assert f"{WORKERS - 12} other workers" in names, (title, names)
        assert len(names) == 13, (title, names)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_routing_page_reads_no_engine_series(backend: str, tmp_path: Any,
                                             request: pytest.FixtureRequest, counted: Reads,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The Routing page reads the routers' series, not the engines': four times the workers'
    counter samples leave its queries and rows as they were."""
    (q1, r1, _), (q4, r4, _) = _sparse_and_dense(backend, tmp_path, request, counted,
                                                 monkeypatch, "routing")
    assert q1 > 0
    assert (q4, r4) == (q1, r1)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_overview_reads_rollups_not_raw_counters(backend: str, tmp_path: Any,
                                                 request: pytest.FixtureRequest,
                                                 counted: Reads,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """On a fleet the Overview's engine hit rates come from the rollup minutes: four times the
    raw counter samples and KV events leave its queries and rows as they were, and the
    headline and per-worker bars still say what the counters did (100 of 400 tokens a
    minute on every worker)."""
    (q1, r1, at), (q4, r4, at4) = _sparse_and_dense(backend, tmp_path, request, counted,
                                                     monkeypatch, "overview")
    assert q1 > 0 and r1 > 0
    assert (q4, r4) == (q1, r1)
    for page in (at, at4):
        rate = next(v for k, v in metrics(page).items() if k.startswith("Engine hit rate"))
        assert rate == "25%", rate
        bars = svg_bars(page, "hit rate per worker")
        assert len(bars["y"]) == WORKERS and all(abs(y - 0.25) < 1e-9 for y in bars["y"])


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_affinity_page_reads_do_not_grow_with_raw_events(backend: str, tmp_path: Any,
                                                         request: pytest.FixtureRequest,
                                                         counted: Reads,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         ) -> None:
    """The Affinity page reads the recent traces, the newest KV events and one resident
    summary per worker: four times the raw KV events and samples leave its queries and rows
    as they were, and its tables still name every image and worker."""
    (q1, r1, at), (q4, r4, _) = _sparse_and_dense(backend, tmp_path, request, counted,
                                                  monkeypatch, "affinity")
    assert q1 > 0 and r1 > 0
    assert (q4, r4) == (q1, r1)
    per_image, several, per_worker = frames(at)
    assert len(per_image) == 30
    assert len(several) == 30 and set(several["copies"]) == {2}
    assert len(per_worker) == WORKERS and per_worker["images"].sum() == 2 * 30
