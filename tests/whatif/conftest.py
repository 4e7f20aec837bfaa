"""The what-if tests' recorded store: the sequence the real SMG 1.13 saw in the fixtures'
capture, twice, a minute apart, with its stored verdicts and the engines' capacity."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmlens.records import MetricSample, RequestTrace, Verdict, labels_of
from mmlens.store.open import open_store
from tests.whatif.support import T0, W1, W2, layout_trace, png

RED, BLUE = png("solid", 64, 64, 1), png("solid", 224, 224, 2)

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


