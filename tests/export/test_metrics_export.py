"""The exporter on a store of constructed records (tests/pages/recorded_store.py: a hit, a
content-blind false hit, a count drift, an error, two workers): promtool-clean exposition,
the same numbers as ``mmlens snapshot --json``, bounded series, shards that add up, and a
missing store that is a metric, not a 500."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time

import httpx
import pytest
from mmlens.collectors.metrics_export import MetricsServer, StoreExport
from mmlens.collectors.verdict_job import VerdictJob
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from mmlens.cli import snapshot as snapshot_cli
from mmlens.export.families import Part
from mmlens.records import CollectorHealth
from mmlens.shard import Shard
from mmlens.store.open import open_store
from tests.conftest import BACKENDS, new_database
from tests.export.metrics_text import by, scrape, series, total
from tests.pages.recorded_store import W1, W2, _traces, fill


def judged(path: str, now: float):
    """The recorded store with every request judged, as the lead collector's job does."""
    rec = fill(path, now)
    store = open_store(path)
    VerdictJob(store).catch_up()
    store.close()
    return rec


@pytest.fixture(params=BACKENDS)
def recorded(request, tmp_path):
    """The judged recorded store on each backend (SQLite file, PostgreSQL server)."""
    if request.param == "sqlite":
        return judged(str(tmp_path / "rec.db"), time.time())
    return judged(new_database(request.getfixturevalue("postgres")), time.time())


def snapshot_json(path: str, capsys) -> dict:
    capsys.readouterr()
    assert snapshot_cli.main(["--db", path, "--json", "--traces", "100000", "--window", "1e10",
                              "--availability-window", "1e10"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_exposition_passes_promtool_check_metrics(recorded) -> None:
    text = scrape(StoreExport(recorded.path))
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                          capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "" and proc.stderr.strip() == "", proc.stdout + proc.stderr
    assert "mmlens_requests_total{" in text and "mmlens_avoidable_prefill_tokens_total{" in text


def test_numbers_equal_snapshot_json(recorded, capsys) -> None:
    found = series(scrape(StoreExport(recorded.path)))
    snap = snapshot_json(recorded.path, capsys)
    verdicts = {k: v for k, v in snap["observed"]["verdicts"].items() if v}
    assert {k: v for k, v in by(found, "mmlens_requests_total", "verdict").items()
            if v} == verdicts
    assert verdicts["false_hit"] >= 1  # the recorded store has one; the check is not vacuous
    avail = snap["availability"]
    assert total(found, "mmlens_evaluated_requests_total") == avail["requests"]
    assert total(found, "mmlens_evaluated_prompt_tokens_total") == avail["prompt_tokens"]
    assert total(found, "mmlens_avoidable_prefill_tokens_total") == avail["avoidable_tokens"]
    assert total(found, "mmlens_false_hit_tokens_total") == avail["false_hit_tokens"] > 0
    causes = {k: v for k, v in by(found, "mmlens_avoidable_prefill_tokens_by_cause_total",
                                   "cause").items() if v}
    assert causes == avail["causes"]
    for worker, h in avail["by_worker"].items():
        realized = total(found, "mmlens_realized_cached_tokens_total", worker=worker)
        prompt = total(found, "mmlens_evaluated_prompt_tokens_total", worker=worker)
        assert realized / prompt == pytest.approx(h["achieved"])
    # The recorded drift request: the engine counted 3 tokens more than its layout.
    assert total(found, "mmlens_count_drift_tokens_total", worker=W2) == 3
    assert total(found, "mmlens_count_drift_tokens_total", worker=W1) == 0


def test_series_count_stays_bounded_as_requests_grow(recorded) -> None:
    before = series(scrape(StoreExport(recorded.path)))
    store = open_store(recorded.path)
    for i in range(40):  # the same routers, models and workers, new request ids
        more = [dataclasses.replace(t, request_id=f"{t.request_id}-{i}", ts=t.ts + 1 + i)
                for t in _traces(recorded.now)]
        store.add_traces(more)
    store.close()
    after = series(scrape(StoreExport(recorded.path)))
    requests = {k for k in after if k[0].startswith("mmlens_requests")}
    assert requests == {k for k in before if k[0].startswith("mmlens_requests")}
    assert len(after) == len(before)
    # Not judged yet: the new requests are pending, on the same series.
    assert total(after, "mmlens_requests_total") == 41 * total(before, "mmlens_requests_total")
    assert total(after, "mmlens_requests_total", verdict="pending") == 40 * 6
    assert not any("request" in dict(labels) or "image" in dict(labels) for _, labels in after)


def test_exemplars_name_the_newest_request_behind_a_series(recorded) -> None:
    """In OpenMetrics (what Prometheus asks for), each verdict's and drift's series carries
    its newest request id as an exemplar: the link to mmlens' Inspector, not a label."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreExport(recorded.path))
    text = openmetrics.generate_latest(registry).decode()
    found = {(s.name, s.labels.get("verdict")): s.exemplar
             for fam in text_string_to_metric_families(text) for s in fam.samples
             if s.value and s.name in ("mmlens_requests_total",
                                       "mmlens_count_drift_tokens_total")}
    assert found[("mmlens_requests_total", "false_hit")].labels == {
        "request_id": recorded.false_hit_id}
    drift = found[("mmlens_count_drift_tokens_total", None)]
    assert drift.labels == {"request_id": recorded.drift_id} and drift.value == 3
    assert all(e is not None for e in found.values())


def test_two_shards_on_one_store_add_up(recorded) -> None:
    whole = series(scrape(StoreExport(recorded.path)))
    parts = [series(scrape(StoreExport(recorded.path, Part(Shard(i, 2))))) for i in range(2)]
    summed = ("mmlens_requests_total", "mmlens_count_drift_tokens_total",
              "mmlens_evaluated_prompt_tokens_total", "mmlens_avoidable_prefill_tokens_total",
              "mmlens_false_hit_tokens_total", "mmlens_image_requests_total")
    for name in summed:
        assert total(parts[0], name) + total(parts[1], name) == total(whole, name), name
    # Each worker's series are in exactly one shard's scrape (W1 hashes to 1, W2 to 0).
    for worker, shard in ((W1, 1), (W2, 0)):
        assert total(parts[shard], "mmlens_requests_total", worker=worker) > 0
        assert total(parts[1 - shard], "mmlens_requests_total", worker=worker) == 0
    # The failed request has no worker: the lead's.
    assert total(parts[0], "mmlens_requests_total", verdict="error") == 1


def test_each_process_exports_its_own_health_rows(tmp_path) -> None:
    store = open_store(str(tmp_path / "h.db"))
    now = time.time()
    mine = CollectorHealth("kv_events", "w1#0", last_success=now, counters={"gaps": 2},
                           errors={"unrecovered_gap": 1, "truncated_frame": 3})
    other = CollectorHealth("kv_events", "w2#0", last_success=now, counters={"gaps": 5})
    store.set_health([mine], now, "host:1:0")
    store.set_health([other], now, "host:2:0")
    store.close()
    found = series(scrape(StoreExport(str(tmp_path / "h.db"), instance="host:1:0")))
    assert total(found, "mmlens_kv_event_gaps_total") == 2
    assert total(found, "mmlens_kv_event_unrecovered_gaps_total", target="w1#0") == 1
    assert total(found, "mmlens_collector_errors_total", kind="truncated_frame") == 3
    assert total(found, "mmlens_collector_last_write_timestamp_seconds") == pytest.approx(now)


def test_missing_store_is_a_metric_and_the_server_answers(tmp_path) -> None:
    export = StoreExport(str(tmp_path / "absent.db"))
    server = MetricsServer(export, "127.0.0.1", 0)
    try:
        r = httpx.get(server.url, timeout=5)
        assert r.status_code == 200
        found = series(r.text)
        assert total(found, "mmlens_exporter_store_up") == 0
        assert total(found, "mmlens_exporter_store_read_errors_total") == 1
        judged(str(tmp_path / "absent.db"), time.time())  # the store appears: the next scrape
        found = series(httpx.get(server.url, timeout=5).text)
        assert total(found, "mmlens_exporter_store_up") == 1
        assert total(found, "mmlens_requests_total") == 6
    finally:
        server.close()
