"""The shipped Prometheus rule file, checked and unit-tested by the real promtool (Debian's
``prometheus`` package): every alert fires on its fault and stays quiet on a healthy
cluster (deploy/prometheus/mmlens-rules.test.yml)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None,
                                reason="promtool not installed (Debian: prometheus)")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], cwd=RULES, capture_output=True, text=True,
                          timeout=60)


def test_rule_file_is_valid() -> None:
    proc = promtool("check", "rules", "mmlens-rules.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 9 rules found" in proc.stdout


def test_promtool_unit_tests_pass() -> None:
    proc = promtool("test", "rules", "mmlens-rules.test.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    alerts = {r["alert"] for g in yaml.safe_load((RULES / "mmlens-rules.yml").read_text())[
        "groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((RULES / "mmlens-rules.test.yml").read_text())["tests"]
    fired = {a["alertname"] for t in tests for a in t["alert_rule_test"] if a["exp_alerts"]}
    quiet = {a["alertname"] for t in tests for a in t["alert_rule_test"] if not a["exp_alerts"]}
    assert fired == alerts and quiet == alerts


def test_a_broken_threshold_is_caught(tmp_path) -> None:
    """The unit tests bite: with the false-hit threshold at 50 % the faulty cluster's 9 %
    no longer fires, and promtool says so."""
    rules = (RULES / "mmlens-rules.yml").read_text()
    assert rules.count(") > 0.05") == 1
    (tmp_path / "mmlens-rules.yml").write_text(rules.replace(") > 0.05", ") > 0.5"))
    shutil.copy(RULES / "mmlens-rules.test.yml", tmp_path)
    proc = subprocess.run(["promtool", "test", "rules", "mmlens-rules.test.yml"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "MmlensFalseHitRateHigh" in proc.stdout + proc.stderr
