"""The store's data versions move when a table's rows do, and not on a collector tick that
wrote nothing new (health rewritten, the same resident summary and meta written again)."""

from __future__ import annotations

from mmlens.records import CollectorHealth, MetricSample, RequestTrace, Verdict, labels_of
from mmlens.store.open import open_store

SUMMARY = {"w1": {"worker": "w1", "rank": 0, "resident_blocks": 40, "images": {}}}


def tick(store, now: float) -> None:
    """What an idle collector writes every few seconds."""
    store.set_health([CollectorHealth("metrics", "w1", last_success=now)], now)
    store.set_kv_state(SUMMARY, now)
    store.set_meta("targets", {"routers": [], "workers": []})


def test_versions_move_with_rows_not_with_idle_ticks(store_db: str) -> None:
    store = open_store(store_db)
    try:
        store.add_traces([RequestTrace("r1", "http://r", "smg", "m", 100.0, False, status=200)])
        store.add_verdicts([Verdict("r1", 100.0, "cold", "nothing cached", judged_at=101.0)])
        store.add_samples([MetricSample("w1", "vllm:x", labels_of({}), 1.0, 100.0)])
        tick(store, 102.0)
        before = store.data_versions()
        tick(store, 107.0)
        assert store.data_versions() == before

        store.add_traces([RequestTrace("r2", "http://r", "smg", "m", 110.0, False, status=200)])
        after = store.data_versions()
        assert after["traces"] != before["traces"]
        assert {k: v for k, v in after.items() if k != "traces"} == \
            {k: v for k, v in before.items() if k != "traces"}

        store.add_verdicts([Verdict("r1", 100.0, "hit", "re-judged", judged_at=111.0,
                                    version=1)])
        assert store.data_versions()["verdicts"] != after["verdicts"]
        store.set_kv_state({"w1": {**SUMMARY["w1"], "resident_blocks": 4000}}, 112.0)
        assert store.data_versions()["kv_state"] != after["kv_state"]
        store.add_samples([MetricSample("w1", "vllm:x", labels_of({}), 1.0, 115.0)])
        assert store.data_versions()["samples"] != after["samples"]
    finally:
        store.close()
