"""Bad input to the commands is exit 2 with a one-line message, never exit 1 with a traceback:
a NUL in ``log_dirs``, a store on a read-only disk, a model folder whose ``vision_config`` is a
list."""

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
