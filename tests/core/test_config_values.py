"""Config and ready files: every wrong value is a ConfigError naming its key; files are confined
to the config's directory or the directories it lists; endpoints are checked."""

from __future__ import annotations

import json

import pytest

from mmlens.cli import collect as collect_cli
from mmlens.config import Config, ConfigError, apply_ready, load_config, read_ready_file
from mmlens.targets_toml import validate_toml


@pytest.mark.parametrize(("text", "message"), [
    ("interval_s = [1]", "interval_s: expected a number"),
    ("interval_s = nan", "interval_s: expected a number"),
    ("timeout_s = true", "timeout_s: expected a number"),
    ("settle_s = -1", "settle_s: expected a number from 0 to 3600"),
    ("store = 3", "store: expected a table"),
    ("[store]\nmax_mb = 'big'", "store.max_mb: expected a number"),
    ("router = 1", "router: expected a list"),
    ("router = [1]", "router[0]: expected a table"),
    ("[[router]]\nurl = 5", "router[0].url: expected a string"),
    ("[[router]]\nurl = 'ftp://x'", "router[0].url: expected a http/https address"),
    ("[[router]]\nurl = 'http://h'\ndiscover_workers = 'no'", "discover_workers: expected true"),
    ("[[worker]]\ndp_size = 'x'", "worker[0].dp_size: expected an integer 1..1024"),
    ("[[worker]]\nkv_events = 'tcp://127.0.0.1:99999'", "worker[0].kv_events: "),
    ("[[worker]]\nkv_events = 'tcp://127.0.0.1'", "has no port"),
    ("[[worker]]\nkv_events = 'http://127.0.0.1:5557'", "expected a tcp/ipc/inproc/grpc"),
    ("[[worker]]\nkv_events = 'tcp://127.0.0.1:65535'\ndp_size = 2", "out of range 1..65534"),
    ("[[worker]]\nmetrics_url = 'http://:80/metrics'", "has no host"),
    ("[otlp]\ngrpc_port = 70000", "otlp.grpc_port: expected an integer 0..65535"),
    ("[demo]\nkv_transport = 'udp'", "demo.kv_transport: expected zmq | grpc"),
    ("[[router]]\nurl = 'http://h'\nlog_file = '/etc/passwd'", "router[0].log_file"),
    ("[[router]]\nurl = 'http://h'\nlog_file = '../x.log'", "outside"),
    ("log_dirs = 'x'", "log_dirs: expected a list"),
    ("x = " + "[" * 5000 + "]" * 5000, "TOML syntax"),
])
def test_bad_values_name_their_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        validate_toml(text)


def test_log_files_are_confined_unless_their_directory_is_listed(tmp_path) -> None:
    outside = tmp_path / "logs"
    outside.mkdir()
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "link.log").symlink_to(outside / "smg.log")
    with pytest.raises(ConfigError, match="outside"):  # a link does not lead out
        validate_toml("[[router]]\nurl = 'http://h'\nlog_file = 'link.log'", conf)
    cfg = validate_toml(f"log_dirs = [{json.dumps(str(outside))}]\n[[router]]\n"
                        "url = 'http://h'\nlog_file = 'link.log'", conf)
    assert cfg.routers[0].log_file == str(outside / "smg.log")
    cfg = validate_toml("[[router]]\nurl = 'http://h'\nlog_file = 'smg.log'", conf)
    assert cfg.routers[0].log_file == str(conf / "smg.log")


def test_good_targets_still_parse() -> None:
    cfg = validate_toml(
        "[[router]]\nurl = 'http://127.0.0.1:30000'\nevent_plane = 'nats://127.0.0.1'\n"
        "[[worker]]\nkv_events = 'tcp://127.0.0.1:5557'\nkv_replay = 'tcp://127.0.0.1:5558'\n"
        "dp_size = 4\n[[worker]]\nkv_events = 'grpc://127.0.0.1:50051'\n"
        "[[worker]]\nkv_events = 'ipc:///run/kv'")
    assert [w.kv_transport for w in cfg.workers] == ["zmq", "grpc", "zmq"]
    assert cfg.workers[0].kv_endpoints()[3][1] == "tcp://127.0.0.1:5560"


READY = {"event": "ready", "router": "http://127.0.0.1:31000", "router_log": "logs/smg.log",
         "workers": [{"name": "w1", "grpc": "grpc://127.0.0.1:31010",
                      "kv_events": "tcp://127.0.0.1:31012", "kv_replay": "tcp://127.0.0.1:31013"}]}


@pytest.mark.parametrize(("change", "message"), [
    ({"workers": 3}, "workers: expected a list"),
    ({"workers": ["w"]}, r"workers\[0\]: expected a table"),
    ({"workers": [{"name": "w", "dp_size": "2"}]}, r"workers\[0\]\.dp_size"),
    ({"workers": [{"name": "w", "kv_events": "tcp://h:0"}]}, "out of range"),
    ({"workers": [{"name": ["w"]}]}, r"workers\[0\]\.name: expected a string"),
    ({"router": 7}, "expected a string"),
    ({"workers": [{"name": "w", "worker_id": "12a"}]}, r"workers\[0\]\.worker_id"),
    ({"router_kind": ["smg"]}, "router_kind"),
])
def test_bad_ready_lines_name_their_key(tmp_path, change: dict, message: str) -> None:
    cfg = Config()
    with pytest.raises(ConfigError, match=message):
        apply_ready(cfg, {**READY, **change}, tmp_path)
    assert cfg.routers == [] and cfg.workers == []  # nothing half-applied


def test_a_ready_line_log_outside_is_left_out_and_said(tmp_path) -> None:
    cfg = Config()
    notes = apply_ready(cfg, {**READY, "router_log": "/etc/passwd"}, tmp_path)
    assert cfg.routers[0].log_file is None and "outside" in notes[0]
    notes = apply_ready(cfg := Config(), {**READY, "routers": [
        {"url": "http://h", "log": "../../x.log"}, {"url": "http://g", "log": "logs/a.log"}]},
        tmp_path)
    assert [r.log_file for r in cfg.routers] == [None, str(tmp_path / "logs" / "a.log")]
    assert len(notes) == 1


def test_ready_files_that_are_not_ready_files(tmp_path) -> None:
    cases = {"missing": None, "binary": b"\xff\xfe\x00{", "list": b"[1, 2]",
             "deep": b"{" * 100_000, "empty": b"", "huge": b" " * (2 << 20)}
    for name, data in cases.items():
        path = tmp_path / name
        if data is not None:
            path.write_bytes(data)
        with pytest.raises(ConfigError, match="ready file"):
            read_ready_file(path)
    (tmp_path / "ok").write_text("log line\n" + json.dumps(READY) + "\n")
    assert read_ready_file(tmp_path / "ok")["router"] == READY["router"]


def test_collect_exits_2_with_a_message(tmp_path, capsys) -> None:
    bad_cfg = tmp_path / "bad.toml"
    bad_cfg.write_text("[[worker]]\nkv_events = 'tcp://127.0.0.1:99999'\n")
    assert collect_cli.main(["--config", str(bad_cfg), "--db", str(tmp_path / "s.db")]) == 2
    assert "worker[0].kv_events" in capsys.readouterr().err
    ready = tmp_path / "ready.json"
    ready.write_text(json.dumps({**READY, "workers": [{"dp_size": None, "name": 5}]}))
    assert collect_cli.main(["--ready-file", str(ready), "--db", str(tmp_path / "s.db")]) == 2
    assert "workers[0].name" in capsys.readouterr().err
    missing = tmp_path / "nope.toml"
    assert collect_cli.main(["--config", str(missing), "--db", str(tmp_path / "s.db")]) == 2
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"bin\.toml"):
        load_config(binary)
