"""`mmlens whatif` over a stored window: the baseline replayed beside the recording, its
error printed beside every figure, several scenarios in one run, per minute, `--json`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmlens.cli import whatif
from tests.whatif.support import T0, W2


def test_json_has_the_baseline_its_error_and_every_scenario(
        db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = whatif.main(["--db", str(db), "--json",
                        "--scenario", "policy=cache_aware,mode=worker",
                        "--scenario", "policy=dynamo,name=dynamo exact",
                        "--scenario", "capacity_blocks=5,name=tiny cache"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workers"] == [W2] and out["requests"] == 8
    base = out["baseline"]
    assert base["scenario"]["policy"] == "cache_aware" and base["scenario"]["mode"] == "router"
    assert base["scenario"]["capacity_blocks"] == 4096  # from the engines' cache_config_info
    assert out["recorded"]["hit_rate"] == pytest.approx(320 / (6 * 81 + 2 * 15))
    # One recorded worker: every replayed request lands there and the baseline is exact.
    assert base["worker_agreement"] == 1.0
    assert out["baseline_error"]["hit_rate"] == pytest.approx(0.0)
    assert base["total"]["verdicts"] == {"cold": 3, "hit": 4, "false_hit": 1}
    assert out["recorded"]["verdicts"] == base["total"]["verdicts"]
    names = [s["scenario"]["name"] for s in out["scenarios"]]
    assert names[1:] == ["dynamo exact", "tiny cache"]
    tiny = out["scenarios"][2]
    assert tiny["total"]["cached_tokens"] < out["recorded"]["cached_tokens"]
    assert tiny["saving_tokens"] < 0 and tiny["evictions"] > 0
    assert [m["minute"] for m in base["minutes"]] == [T0 // 60 * 60, T0 // 60 * 60 + 60]


def test_text_table_prints_the_error_beside_each_figure(
        db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert whatif.main(["--db", str(db), "--policy", "round_robin", "--workers", "2",
                        "--minutes"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("hit rate (tokens)"))
    assert row.count("±0.0pt") == 2  # the baseline and the one scenario
    assert "round_robin" in text and "hit rate per minute" in text
    assert "verdict false_hit" in text


def test_bad_scenarios_and_block_sizes_are_refused(
        db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert whatif.main(["--db", str(db), "--scenario", "policy=nope"]) == 2
    assert "unknown policy" in capsys.readouterr().err
    assert whatif.main(["--db", str(db), "--block-size", "24"]) == 2
    assert "not a multiple" in capsys.readouterr().err
