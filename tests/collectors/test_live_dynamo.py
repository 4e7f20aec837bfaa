"""Collectors against the real Dynamo 1.6.1 frontend of `mmlens demo --router dynamo`."""

from __future__ import annotations

import importlib.util
import json

import pytest

from mmlens.cli import collect as collect_cli
from mmlens.cli import snapshot as snapshot_cli
from tests.live_support import demo_process, free_port_base

pytestmark = [pytest.mark.live, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("dynamo") is None,
                                 reason="Dynamo extra not installed (requirements-dynamo.txt)")]


def test_dynamo_collect_then_snapshot(tmp_path, capsys) -> None:
    ready = tmp_path / "ready.json"
    args = ["--router", "dynamo", "--port-base", str(free_port_base(50)),
            "--log-dir", str(tmp_path / "logs")]
    with demo_process(args, ready, "Dynamo demo") as info:
        (tmp_path / "mmlens.toml").write_text(f'interval_s = 1\n[demo]\nready_file = "{ready}"\n')
        db = tmp_path / "d.db"
        assert collect_cli.main(["--config", str(tmp_path / "mmlens.toml"), "--db", str(db),
                                 "--duration", "4", "--workload", "6"]) == 0
        capsys.readouterr()
        assert snapshot_cli.main(["--db", str(db), "--json"]) == 0
        snap = json.loads(capsys.readouterr().out)

    ids = {str(w["worker_id"]) for w in info["workers"]}
    assert snap["flavors"]["demo"] == ["dynamo_frontend"]
    assert snap["router_state"][0]["kind"] == "dynamo"
    d = snap["dynamo"]["demo"]
    assert {w["worker_id"] for w in d["registered_workers"]} == ids
    assert d["block_size"] == {"Qwen/Qwen3-VL-2B-Instruct": 16.0}
    assert d["predicted_requests"] >= 6
    # The frontend's cached/ISL ratio is flagged: ISL is the unexpanded prompt.
    (fe,) = [h for h in snap["hit_rates"] if h["source"] == "dynamo_frontend"]
    assert fe["hit_rate"] is None and fe["warning"]
    workers = [h for h in snap["hit_rates"] if h["source"] == "vllm"]
    assert {h["worker"] for h in workers} == ids and max(h["hit_rate"] or 0 for h in workers) > 0
    traces = snap["traces"]
    assert len(traces) == 6 and all(t["worker"] in ids for t in traces)
    assert all(t["router_kind"] == "dynamo" and t["prompt_tokens"] == 81 for t in traces)
    assert any(t["cached_tokens"] == 80 for t in traces)
    sources = {p["source"] for t in traces for p in t["predictions"]}
    assert {"nvext.timing", "log:routing_best"} <= sources  # the ready line names the log
    best = [p for t in traces for p in t["predictions"] if p["source"] == "log:routing_best"]
    assert all(p["request_blocks"] == 6 for p in best)  # ceil(96 / 16): padded routing view
    assert sum(r["blocks"] for r in snap["resident_blocks"].values()) > 0
    assert snap["router_kv_event_health"]["demo"]["events_flowing"] is True
