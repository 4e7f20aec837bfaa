"""mmlens.toml parsing: targets, secrets by env-var name only, DP offsets, demo ready line."""

from __future__ import annotations

import json

import pytest

from mmlens.config import (
    Config,
    ConfigError,
    apply_ready,
    load_config,
    offset_endpoint,
    parse_config,
    read_ready_file,
)

TOML = """
interval_s = 2
settle_s = 3
[store]
retention_s = 600
max_mb = 64
[prometheus]
url = "http://127.0.0.1:9090"
[[router]]
name = "smg"
kind = "smg"
url = "http://127.0.0.1:30000"
metrics_url = "http://127.0.0.1:29000/metrics"
api_key_env = "MMLENS_TEST_KEY"
log_file = "smg.log"
[[worker]]
name = "w1"
engine = "sglang"
router_url = "grpc://127.0.0.1:50051"
metrics_url = "http://127.0.0.1:18001/metrics"
kv_events = "tcp://127.0.0.1:5557"
kv_replay = "tcp://127.0.0.1:5558"
dp_size = 3
topic = "kv-events"
model = "qwen3-vl"
"""


def test_full_config(tmp_path, monkeypatch) -> None:
    path = tmp_path / "mmlens.toml"
    path.write_text(TOML)
    monkeypatch.setenv("MMLENS_CONFIG", str(path))
    monkeypatch.setenv("MMLENS_TEST_KEY", "sk-secret")
    cfg = load_config()
    assert (cfg.interval_s, cfg.retention_s, cfg.max_mb) == (2.0, 600.0, 64.0)
    assert (cfg.settle_s, Config().settle_s) == (3.0, 12.0)
    assert cfg.prometheus_url == "http://127.0.0.1:9090"
    (r,) = cfg.routers
    assert (r.kind, r.api_key_env, r.api_key()) == ("smg", "MMLENS_TEST_KEY", "sk-secret")
    assert r.log_file == str(tmp_path / "smg.log")
    (w,) = cfg.workers
    assert w.model == "qwen3-vl"
    assert w.kv_endpoints() == [
        (0, "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"),
        (1, "tcp://127.0.0.1:5558", "tcp://127.0.0.1:5559"),
        (2, "tcp://127.0.0.1:5559", "tcp://127.0.0.1:5560"),
    ]
    assert "sk-secret" not in repr(cfg)


@pytest.mark.parametrize("doc", [
    {"router": [{"url": "http://r", "api_key": "sk-1"}]},
    {"prometheus": {"url": "http://p", "password": "x"}},
    {"worker": [{"name": "w", "token": "t"}]},
])
def test_secrets_in_the_file_are_refused(doc) -> None:
    with pytest.raises(ConfigError, match="environment"):
        parse_config(doc)


@pytest.mark.parametrize(("doc", "msg"), [
    ({"router": [{"kind": "nginx", "url": "http://r"}]}, "kind"),
    ({"router": [{"kind": "smg"}]}, "url"),
    ({"worker": [{"engine": "trtllm"}]}, "engine"),
    ({"worker": [{"dp_size": 0}]}, "dp_size"),
])
def test_invalid_values(doc, msg) -> None:
    with pytest.raises(ConfigError, match=msg):
        parse_config(doc)


def test_missing_and_broken_files(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("MMLENS_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="MMLENS_CONFIG"):
        load_config()
    bad = tmp_path / "bad.toml"
    bad.write_text("[[router]\n")
    with pytest.raises(ConfigError):
        load_config(bad)


@pytest.mark.parametrize(("endpoint", "rank", "expected"), [
    ("tcp://*:5557", 0, "tcp://*:5557"),
    ("tcp://127.0.0.1:5557", 2, "tcp://127.0.0.1:5559"),
    ("ipc://kv.sock", 1, "ipc://kv.sock_dp1"),
    ("inproc://kv", 3, "inproc://kv_dp3"),
])
def test_dp_rank_offsets(endpoint, rank, expected) -> None:
    assert offset_endpoint(endpoint, rank) == expected


def test_demo_ready_line(tmp_path) -> None:
    ready = {"event": "ready", "router": "http://127.0.0.1:31000",
             "router_metrics": "http://127.0.0.1:31001/metrics",
             "workers": [{"name": "w1", "grpc": "grpc://127.0.0.1:31010",
                          "http": "http://127.0.0.1:31011",
                          "metrics": "http://127.0.0.1:31011/metrics",
                          "kv_events": "tcp://127.0.0.1:31012",
                          "kv_replay": "tcp://127.0.0.1:31013", "kv_topic": "kv-events",
                          "model": "qwen3-vl"}],
             "models": [{"id": "Qwen/Qwen3-VL-2B-Instruct"}]}
    path = tmp_path / "ready.json"
    path.write_text("starting\n" + json.dumps(ready) + "\n")
    cfg = Config()
    apply_ready(cfg, read_ready_file(path))
    apply_ready(cfg, read_ready_file(path))  # idempotent
    assert [(r.url, r.metrics_url) for r in cfg.routers] == [
        ("http://127.0.0.1:31000", "http://127.0.0.1:31001/metrics")]
    (w,) = cfg.workers
    assert (w.router_url, w.topic, w.kv_replay, w.model) == (
        "grpc://127.0.0.1:31010", "kv-events", "tcp://127.0.0.1:31013", "qwen3-vl")
    with pytest.raises(ConfigError):
        apply_ready(cfg, {"event": "started"})


def test_demo_ready_line_with_two_routers() -> None:
    ready = {"event": "ready", "router": "http://127.0.0.1:1", "routers": [
        {"name": "demo", "url": "http://127.0.0.1:1", "log": "a.log"},
        {"name": "demo-worker", "url": "http://127.0.0.1:3", "metrics": "http://x:4/metrics"}],
        "workers": []}
    cfg = Config()
    apply_ready(cfg, ready)
    apply_ready(cfg, ready)
    assert [(r.name, r.url, r.log_file) for r in cfg.routers] == [
        ("demo", "http://127.0.0.1:1", "a.log"),
        ("demo-worker", "http://127.0.0.1:3", None)]


def test_media_origin_from_the_toml_the_ready_line_and_the_targets_text() -> None:
    from mmlens.targets_toml import config_toml_from_ready, validate_toml

    cfg = parse_config({"router": [{"url": "http://127.0.0.1:1",
                                    "media_origin": "http://127.0.0.1:8"}, {"url": "http://h:2"}]})
    assert [r.media_origin for r in cfg.routers] == ["http://127.0.0.1:8", None]
    for bad in ("ftp://127.0.0.1:8", "http://127.0.0.1:99999", 8):
        with pytest.raises(ConfigError, match=r"router\[0\]\.media_origin"):
            parse_config({"router": [{"url": "http://127.0.0.1:1", "media_origin": bad}]})
    ready = {"event": "ready", "routers": [{"name": "demo", "url": "http://127.0.0.1:1"},
                                           {"name": "demo-worker", "url": "http://127.0.0.1:3"}],
             "workers": [], "media_origin": "http://127.0.0.1:8"}
    cfg = Config()
    apply_ready(cfg, ready)
    assert [r.media_origin for r in cfg.routers] == ["http://127.0.0.1:8"] * 2
    text = config_toml_from_ready(ready)
    assert [r.media_origin for r in validate_toml(text).routers] == ["http://127.0.0.1:8"] * 2
    with pytest.raises(ConfigError, match="media_origin"):
        apply_ready(Config(), {**ready, "media_origin": "tcp://127.0.0.1:8"})
