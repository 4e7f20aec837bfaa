"""`scripts/run` installs only when the requirements changed: a second run goes straight to the
dashboard, a changed requirements file or a failed install means an install runs (again), with
uv when it can be had and pip otherwise. A stand-in venv records what it was asked to do (no
network, no real install)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.live_support import REPO

FAKE_PYTHON = """#!/bin/bash
here="$(dirname "$0")"
if [ "$1" = "-VV" ]; then echo "Python 3.11 stand-in"; exit 0; fi
if [ "$3" = "config" ]; then [ -n "$PIP_CONFIG_INDEX" ] && echo "$PIP_CONFIG_INDEX"; exit $?; fi
if [ "$*" = "-m pip install -q --disable-pip-version-check uv" ]; then
  [ -n "$NO_UV" ] && exit 1
  printf '%s\\n' "$FAKE_UV" > "$here/uv"; chmod +x "$here/uv"; exit 0
fi
echo "pip $*" >> "$here/../calls"
echo "Collecting streamlit"; echo "  some detail"; echo "Successfully installed streamlit"
exit "${FAIL:-0}"
"""

FAKE_UV = """#!/bin/bash
echo "uv $*" >> "$(dirname "$0")/../calls"
echo "Resolved 1 package"; echo " + streamlit==1.0"
exit "${FAIL:-0}"
"""


def _copy(tmp: Path) -> Path:
    (tmp / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "run", tmp / "scripts" / "run")
    for name in ("requirements.txt", "pyproject.toml"):
        shutil.copy(REPO / name, tmp / name)
    bin_dir = tmp / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "mmlens").write_text('#!/bin/bash\necho "mmlens $*"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return tmp


def _run(root: Path, fail: int = 0, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "scripts/run", "--port", "1"], cwd=root, text=True,
                          capture_output=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "FAIL": str(fail), "FAKE_UV": FAKE_UV,
                               **env})


def _calls(root: Path) -> list[str]:
    calls = root / ".venv" / "calls"
    return [line.split()[0] for line in calls.read_text().splitlines()] if calls.exists() else []


def _pip_calls(root: Path) -> int:
    return len(_calls(root))


def test_second_run_skips_the_install_until_requirements_change(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    first = _run(root, NO_UV="1")
    assert first.returncode == 0 and _calls(root) == ["pip"]
    assert "Collecting streamlit" in first.stdout and "some detail" not in first.stdout
    assert first.stdout.rstrip().endswith("mmlens dashboard --demo --port 1")
    second = _run(root)
    assert second.returncode == 0 and _pip_calls(root) == 1
    assert "installing" not in second.stdout
    with (root / "requirements.txt").open("a") as f:
        f.write("# changed\n")
    assert _run(root).returncode == 0 and _pip_calls(root) == 2


def test_a_failed_install_is_tried_again(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    failed = _run(root, fail=1, NO_UV="1")
    assert failed.returncode != 0 and "mmlens dashboard" not in failed.stdout
    assert _run(root, NO_UV="1").returncode == 0 and _pip_calls(root) == 2


def test_uv_installs_when_it_can_be_had_and_pip_takes_over_when_it_fails(
        tmp_path: Path) -> None:
    root = _copy(tmp_path)
    first = _run(root)
    assert first.returncode == 0 and _calls(root) == ["uv"]
    assert "+ streamlit==1.0" in first.stdout
    assert first.stdout.rstrip().endswith("mmlens dashboard --demo --port 1")
    assert _run(root).returncode == 0 and _calls(root) == ["uv"]
    (root / "requirements.txt").write_text("streamlit\n")
    failed = _run(root, fail=1)
    assert _calls(root) == ["uv", "uv", "pip"] and failed.returncode != 0
    assert "uv could not install; trying pip" in failed.stdout


def test_pip_installs_when_pip_is_pointed_at_its_own_index(tmp_path: Path) -> None:
    """uv does not read pip's configuration: a mirror set for pip keeps pip."""
    root = _copy(tmp_path)
    assert _run(root, PIP_CONFIG_INDEX="https://mirror.invalid/simple").returncode == 0
    assert _calls(root) == ["pip"]
    (root / "requirements.txt").write_text("streamlit\n")
    assert _run(root, PIP_INDEX_URL="https://mirror.invalid/simple").returncode == 0
    assert _calls(root) == ["pip", "pip"]


def test_a_changed_compiled_module_source_installs_again(tmp_path: Path) -> None:
    """Every C source under mmlens/ is in the stamp, a module added later too."""
    root = _copy(tmp_path)
    source = root / "mmlens" / "store" / "_rows.c"
    source.parent.mkdir(parents=True)
    source.write_text("/* one */\n")
    assert _run(root).returncode == 0 and _pip_calls(root) == 1
    assert _run(root).returncode == 0 and _pip_calls(root) == 1
    source.write_text("/* two */\n")
    assert _run(root).returncode == 0 and _pip_calls(root) == 2
