"""`scripts/run` installs only when the requirements changed: a second run goes straight to the
dashboard, a changed requirements file or a failed install means pip runs (again). A stand-in
venv records what it was asked to do (no network, no real install)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.live_support import REPO

FAKE_PYTHON = """#!/bin/bash
if [ "$1" = "-VV" ]; then echo "Python 3.11 stand-in"; exit 0; fi
echo "pip $*" >> "$(dirname "$0")/../calls"
echo "Collecting streamlit"; echo "  some detail"; echo "Successfully installed streamlit"
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


def _run(root: Path, fail: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "scripts/run", "--port", "1"], cwd=root, text=True,
                          capture_output=True, env={"PATH": "/usr/bin:/bin", "FAIL": str(fail)},
                          timeout=60)


def _pip_calls(root: Path) -> int:
    calls = root / ".venv" / "calls"
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_second_run_skips_the_install_until_requirements_change(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    first = _run(root)
    assert first.returncode == 0 and _pip_calls(root) == 1
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
    failed = _run(root, fail=1)
    assert failed.returncode != 0 and "mmlens dashboard" not in failed.stdout
    assert _run(root).returncode == 0 and _pip_calls(root) == 2


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
