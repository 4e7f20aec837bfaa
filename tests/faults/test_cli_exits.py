"""Bad input to the commands is exit 2 with a one-line message, never exit 1 with a traceback:
a NUL in ``log_dirs``, a store on a read-only disk, a model folder whose ``vision_config`` is a
list; an OTLP body over the limit is answered 413, not cut off with a reset."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mmlens.cli import collect, layout
from mmlens.store.sqlite import Store
from tests.faults.test_store_outages import small_disk

pytestmark = pytest.mark.faults
ROUTER = '[[router]]\nname = "r"\nkind = "smg"\nurl = "http://127.0.0.1:9"\n'


def test_a_nul_in_log_dirs_is_a_config_error(tmp_path: Path, capsys) -> None:
    config = tmp_path / "m.toml"
    config.write_text('log_dirs = ["a\\u0000b"]\n' + ROUTER)
    assert collect.main(["--config", str(config), "--db", str(tmp_path / "s.db"),
                         "--duration", "0"]) == 2
    assert "log_dirs: expected a list of directory paths" in capsys.readouterr().err


def test_a_store_on_a_read_only_disk_is_named(tmp_path: Path, capsys) -> None:
    config = tmp_path / "m.toml"
    config.write_text(ROUTER)
    with small_disk(tmp_path / "disk", "1m") as disk:
        Store(disk / "s.db").close()
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        for db in (disk / "s.db", disk / "new.db"):
            assert collect.main(["--config", str(config), "--db", str(db),
                                 "--duration", "0"]) == 2
            assert f"cannot open the store {db} for writing" in capsys.readouterr().err


def test_a_model_dir_transformers_refuses_is_a_layout_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl",
                                                      "vision_config": [1]}))
    assert layout.main(["--model", str(tmp_path), "--image", "640x480"]) == 2
    err = capsys.readouterr().err
    assert "transformers cannot load its tokenizer" in err and "Traceback" not in err


def post_whole(port: int, body: bytes) -> bytes:
    """A client that sends its whole request before reading the answer (as curl and most
    SDK exporters do): what it reads back."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: "
                     b"application/x-protobuf\r\ncontent-length: %d\r\n\r\n" % len(body))
        sock.sendall(body)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def test_an_otlp_body_over_the_limit_gets_its_413_not_a_broken_pipe() -> None:
    from mmlens.collectors.otlp_receiver import OtlpReceiver

    got: list[object] = []
    rx = OtlpReceiver(got.extend, grpc_port=None, http_port=0, max_body=1 << 20).start()
    try:  # 24 MiB over a 1 MiB limit: more than the socket buffers between them hold
        for _ in range(2):
            answer = post_whole(rx.http_port, b"\0" * (24 << 20))
            assert answer.startswith(b"HTTP/1.1 413") and b"over 1048576" in answer
    finally:
        rx.stop()
    assert rx.health.errors == {"too_large": 2} and got == []
