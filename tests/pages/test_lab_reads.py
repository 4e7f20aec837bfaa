"""The Lab's router modes come from one series' samples: the same modes the routers' whole
normalized metrics gave, on either backend; and its first visit does not import the sender
(its HTTP client's import was most of that visit's script)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mmlens.analysis.views.lab import modes_of_samples, router_modes
from mmlens.analysis.views.routing import MODE_SERIES
from mmlens.records import MetricSample, labels_of
from mmlens.store.open import open_store
from mmlens.store.reader import open_reader
from tests.conftest import new_database
from tests.pages.apptest_util import APP

REPO = Path(__file__).resolve().parents[2]


def _samples(now: float) -> list[MetricSample]:
    """Two routers' mode series, the busier mode changing mid-window on one, beside other
    router and engine series and a sample older than the window."""
    out = []
    for i in range(10):
        ts = now - 250 + 25 * i
        for target, mode, reason, count in (
                ("smg-a", "router", "auto_mixed", 5 * i), ("smg-a", "worker", "fallback", 40),
                ("smg-b", "worker", "configured", 3 * i), ("smg-b", "router", "auto", 1)):
            out.append(MetricSample(target, MODE_SERIES, labels_of(
                {"model": "m", "mode": mode, "reason": reason}), count, ts))
        out.append(MetricSample("smg-a", "smg_worker_requests_total",
                                labels_of({"worker": "http://w1", "model": "m"}), i, ts))
        out.append(MetricSample("http://w1", "vllm:prefix_cache_hits_total",
                                labels_of({"model_name": "m", "engine": "0"}), i, ts))
    out.append(MetricSample("smg-c", MODE_SERIES, labels_of(
        {"model": "m", "mode": "worker", "reason": "old"}), 99, now - 400))
    return out


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_lab_modes_equal_the_router_metrics_modes(backend: str, tmp_path: Any,
                                                  request: pytest.FixtureRequest) -> None:
    path = (str(tmp_path / "lab.db") if backend == "sqlite"
            else new_database(request.getfixturevalue("postgres")))
    now = time.time()
    store = open_store(path)
    try:
        store.add_samples(_samples(now))
    finally:
        store.close()
    reader = open_reader(path)
    try:
        old = router_modes(reader.router_metrics().mm_processing)
        new = modes_of_samples(reader.recent_samples(300.0, [MODE_SERIES]))
    finally:
        reader.close()
    # smg-a: router mode overtook its 40 worker-mode requests (45 at the newest scrape)
    assert old == {"smg-a": "router", "smg-b": "worker"}
    assert new == old


def test_lab_first_visit_does_not_import_the_sender(tmp_path: Any) -> None:
    """A fresh interpreter's Lab visit (a router configured) leaves the sender unimported."""
    path = tmp_path / "lab.db"
    store = open_store(str(path))
    try:
        store.set_meta("targets", {"routers": [
            {"name": "r", "kind": "smg", "url": "http://127.0.0.1:9"}]})
        store.add_samples(_samples(time.time()))
    finally:
        store.close()
    script = (
        "import os, sys\n"
        f"os.environ['MMLENS_DB'] = {str(path)!r}\n"
        "os.environ.pop('MMLENS_CONFIG', None)\n"
        "from streamlit.testing.v1 import AppTest\n"
        f"at = AppTest.from_file({str(APP)!r}, default_timeout=60)\n"
        "at.run()\n"
        "at.switch_page('pages/lab.py').run()\n"
        "assert not at.exception, [e.value for e in at.exception]\n"
        "assert at.title[0].value == 'Lab', at.title\n"
        "assert [b.label for b in at.button] == ['Send'], at.button\n"
        "print('sender' if 'mmlens.collectors.sender' in sys.modules else 'no sender')\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "no sender"
