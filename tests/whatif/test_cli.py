"""`mmlens whatif` over a stored window: the baseline replayed beside the recording, its
error printed beside every figure, several scenarios in one run, per minute, `--json`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmlens.cli import whatif
from mmlens.records import MetricSample, RequestTrace, Verdict, labels_of
from mmlens.store.open import open_store
from tests.whatif.support import T0, layout_trace, png

RED, BLUE = png("solid", 64, 64, 1), png("solid", 224, 224, 2)
W1, W2 = "grpc://127.0.0.1:50051", "grpc://127.0.0.1:50052"
# What the real SMG 1.13 did with this sequence (tests/fixtures/captures): one worker, the
# repeats cached 80 of 81 tokens, blue a false hit; a minute later all three images are warm.
SEQUENCE = [("red", [RED], 0, "cold"), ("red-again", [RED], 80, "hit"),
            ("blue", [BLUE], 0, "false_hit"), ("text", [], 0, "cold")]
WARM = [("red", [RED], 80, "hit"), ("red-again", [RED], 80, "hit"),
        ("blue", [BLUE], 80, "hit"), ("text", [], 0, "cold")]


def _trace(rid: str, ts: float, images: list[bytes], cached: int) -> RequestTrace:
    base = layout_trace("Describe this image in detail please.", tuple(images))
    lay = base.expected_layout
    assert lay is not None
    return RequestTrace(rid, "http://127.0.0.1:30000", "smg", base.model, ts, False,
                        images=base.images, status=200, worker=W2,
                        prompt_tokens=lay.engine_prompt_tokens, cached_tokens=cached,
                        completion_tokens=8, latency_s=0.2, ttft_s=0.05,
                        processing_mode="router", expected_layout=lay)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("whatif") / "w.db"
    store = open_store(path)
    traces, verdicts = [], []
    for minute, sequence in enumerate((SEQUENCE, WARM)):
        for i, (name, images, cached, verdict) in enumerate(sequence):
            rid, ts = f"{name}-{minute}", T0 + 60 * minute + 2 * i
            traces.append(_trace(rid, ts, images, cached))
            verdicts.append(Verdict(rid, ts, verdict, verdict))
    store.add_traces(traces)
    store.add_verdicts(verdicts)
    store.add_samples([MetricSample(w, "vllm:cache_config_info", labels_of(
        {"block_size": "16", "num_gpu_blocks": "4096"}), 1.0, T0) for w in (W1, W2)])
    store.close()
    return path


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
