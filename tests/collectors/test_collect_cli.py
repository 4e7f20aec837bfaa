"""`mmlens collect` + `mmlens snapshot --json` end to end on loopback fakes built from the
recorded SMG outputs, a ZMQ publisher, a router log, a hanging and an HTML-answering target."""

from __future__ import annotations

import json
import threading
import time

import pytest
import zmq

from mmlens.cli import collect as collect_cli
from mmlens.cli import snapshot as snapshot_cli
from mmlens.cli.main import main as mmlens_main
from mmlens.store.sqlite import SCHEMA_VERSION
from tests.collectors.loopback import Loopback, Route
from tests.collectors.zmq_publisher import Publisher
from tests.fixtures_path import capture
from tests.live_support import loopback_endpoints

JSON = "application/json"
IMG = "e" * 64


def _chat_reply() -> Route:
    body = {"id": "chatcmpl-1", "usage": {"prompt_tokens": 81, "completion_tokens": 4,
                                          "prompt_tokens_details": {"cached_tokens": 80}}}
    return Route(json.dumps(body), content_type=JSON, headers={
        "x-smg-routed-worker-id": "grpc://127.0.0.1:50051",
        "x-smg-cache-trace": json.dumps(json.loads(capture(
            "smg_cache_trace_header_sample.json")))})


@pytest.fixture
def world(tmp_path):
    ctx = zmq.Context()
    pub_ep, replay_ep = loopback_endpoints(2)
    pub = Publisher(ctx, pub_ep, replay_ep)
    lbl = '{engine="0",model_name="Qwen/Qwen3-VL-2B-Instruct"}'
    vllm = (f"# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{lbl} 60\n"
            f"# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{lbl} 80\n")
    routes = {
        "/metrics": Route(capture("smg_grpc_metrics_kv.txt")),
        "/w1/metrics": Route(vllm),
        "/hang/metrics": Route("x 1\n", delay_s=5),
        "/html/metrics": Route("<html><body>proxy login</body></html>", content_type="text/html"),
        "/workers": Route(capture("smg_grpc_workers.json"), content_type=JSON),
        "/get_loads": Route(capture("smg_grpc_get_loads.json"), content_type=JSON),
        "/v1/models": Route(capture("smg_http_v1_models.txt"), content_type=JSON),
        "/readiness": Route(capture("smg_http_readiness.txt"), content_type=JSON),
        "/v1/chat/completions": _chat_reply(),
    }
    log = tmp_path / "smg.log"
    with Loopback(routes) as lb:
        (tmp_path / "mmlens.toml").write_text(f"""
interval_s = 0.5
timeout_s = 0.5
[[router]]
name = "smg"
kind = "smg"
url = "{lb.url}"
metrics_url = "{lb.url}/metrics"
log_file = "{log}"
[[worker]]
name = "w1"
router_url = "grpc://127.0.0.1:50051"
metrics_url = "{lb.url}/w1/metrics"
kv_events = "{pub_ep}"
kv_replay = "{replay_ep}"
[[worker]]
name = "hang"
metrics_url = "{lb.url}/hang/metrics"
[[worker]]
name = "html"
metrics_url = "{lb.url}/html/metrics"
""")
        yield {"tmp": tmp_path, "pub": pub, "log": log, "lb": lb}
    pub.close()
    ctx.destroy(linger=0)


def test_collect_and_snapshot(world, capsys) -> None:
    tmp, pub, log = world["tmp"], world["pub"], world["log"]
    stop = threading.Event()

    def publish() -> None:  # keep publishing until the collector has connected and seen some
        seq_hashes = 0
        while not stop.is_set():
            seq_hashes += 1
            pub.publish([time.time(), [{"type": "BlockStored", "block_hashes": [seq_hashes],
                                        "parent_block_hash": None, "token_ids": [5] * 16,
                                        "block_size": 16, "extra_keys": [[[IMG, 0]]]}], 0])
            time.sleep(0.05)

    log.write_text(json.dumps({"message": "Event-driven routing", "branch": "event_hit",
                               "worker": "grpc://127.0.0.1:50051", "overlap_blocks": 5,
                               "request_blocks": 5, "span": {"request_id": "r-1"}}) + "\n")
    t = threading.Thread(target=publish, daemon=True)
    t.start()
    db = tmp / "s.db"
    t0 = time.monotonic()
    try:
        assert collect_cli.main(["--config", str(tmp / "mmlens.toml"), "--db", str(db),
                                 "--duration", "2.5", "--workload", "3"]) == 0
    finally:
        stop.set()
        t.join()
    assert time.monotonic() - t0 < 15  # the hanging target never held the loop up
    capsys.readouterr()
    assert mmlens_main(["snapshot", "--db", str(db), "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)

    assert snap["schema_version"] == SCHEMA_VERSION
    assert snap["mm_processing"][0]["reason"] == "auto_mixed"
    assert snap["cache_aware_branches"]["smg"] == {"event_hit": 5.0, "event_miss": 1.0}
    (hr,) = snap["hit_rates"]
    assert (hr["worker"], hr["hit_rate"]) == ("grpc://127.0.0.1:50051", 0.75)
    res = snap["resident_blocks"]["grpc://127.0.0.1:50051#0"]
    assert res["blocks"] > 0 and res["images"][IMG] == res["blocks"]
    ep = snap["kv_event_health"]["endpoints"]["grpc://127.0.0.1:50051#0"]
    assert ep["batches"] > 0 and ep["errors"] == {}
    assert len(snap["traces"]) == 3
    tr = next(t for t in snap["traces"] if t["stream"])  # answered as JSON: still read
    assert (tr["worker"], tr["cached_tokens"], tr["prompt_tokens"]) == (
        "grpc://127.0.0.1:50051", 80, 81)
    assert tr["predictions"][0]["branch"] == "event_hit"
    assert snap["router_state"][0]["readiness"]["status"] == "ready"
    health = {(h["collector"], h["target"]): h for h in snap["health"]}
    assert health[("metrics", "hang")]["errors"].get("timeout", 0) >= 1
    assert health[("metrics", "html")]["errors"].get("html_answer", 0) >= 1
    assert health[("metrics", "smg")]["errors"] == {}
    assert health[("router_logs", "smg")]["counters"]["decisions"] == 1
    # `observed` counts every request of the window, not only the listed ones.
    assert mmlens_main(["snapshot", "--db", str(db), "--json", "--traces", "1"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert len(one["traces"]) == 1
    assert (one["observed"]["requests"], one["observed"]["window_s"]) == (3, 300.0)
    assert sum(one["observed"]["verdicts"].values()) == 3
    # Text mode for people.
    assert snapshot_cli.main(["--db", str(db)]) == 0
    assert "auto_mixed" in capsys.readouterr().out


def test_cli_errors(tmp_path, capsys) -> None:
    assert collect_cli.main(["--config", str(tmp_path / "none.toml"), "--db",
                             str(tmp_path / "x.db")]) == 2
    (tmp_path / "bad.toml").write_text('[[router]]\nurl = "http://r"\napi_key = "sk"\n')
    assert collect_cli.main(["--config", str(tmp_path / "bad.toml"), "--db",
                             str(tmp_path / "x.db")]) == 2
    assert "environment" in capsys.readouterr().err
    assert snapshot_cli.main(["--db", str(tmp_path / "missing.db"), "--json"]) == 2


def test_api_key_never_reaches_the_store(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MMLENS_TEST_SECRET", "sk-very-secret")
    seen: list[str] = []
    routes = {"/workers": Route('{"workers":[],"total":0}', content_type=JSON),
              "/v1/models": Route('{"data":[{"id":"m"}]}', content_type=JSON)}
    with Loopback(routes) as lb:
        (tmp_path / "m.toml").write_text(
            f'interval_s = 0.2\n[[router]]\nname = "r"\nkind = "smg"\nurl = "{lb.url}"\n'
            'api_key_env = "MMLENS_TEST_SECRET"\n')
        assert collect_cli.main(["--config", str(tmp_path / "m.toml"), "--db",
                                 str(tmp_path / "s.db"), "--duration", "0.5"]) == 0
        seen = [h.get("authorization") or h.get("Authorization") or ""
                for _, _, h, _ in lb.requests]
    assert seen and all(a == "Bearer sk-very-secret" for a in seen)
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*"))
    assert b"sk-very-secret" not in raw
