"""The Routing page on a store holding what the collectors recorded from the real Dynamo 1.6.1
frontend: per-model MM-routing verdicts and per-request fallback warnings (no Dynamo needed)."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import pytest

from mmlens.ingest.dynamo_logs import model_mm_routing
from mmlens.records import RequestTrace, RoutingDecision
from mmlens.store.sqlite import Store
from tests.pages.apptest_util import (  # strict_page_guard: autouse here
    assert_clean,
    drawn_decisions,
    frames,
    open_page,
    strict_page_guard,  # noqa: F401
)

SUPPORT = (Path(__file__).resolve().parent.parent / "fixtures"
           / "dynamo_frontend_mm_support_1.6.1.jsonl")
FALLBACK = ("mm-routing: failed to fetch image dims; MM routing entry skipped; error=fetch_image"
            "_dims failed: image dim fetch expected 206 Partial Content, got HTTP 200 OK")


@pytest.fixture
def dynamo_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "mmlens.db"
    store = Store(path)
    table = model_mm_routing(SUPPORT.read_text().splitlines())
    store.set_meta("dynamo_mm_routing", {m: asdict(v) for m, v in table.items()})
    now = time.time()
    warm = RequestTrace("dyn-warm", "http://127.0.0.1:8000", "dynamo",
                        "Qwen/Qwen3-VL-2B-Instruct", now, False, status=200, worker="7",
                        prompt_tokens=317, cached_tokens=304, predictions=[
                            RoutingDecision("dyn-warm", "dynamo", "nvext.timing", worker="7",
                                            kv_hit_rate=0.95),
                            RoutingDecision("dyn-warm", "dynamo", "log:routing_best",
                                            worker="7", overlap_blocks=19, request_blocks=20)])
    plain = RequestTrace("dyn-plain", "http://127.0.0.1:8000", "dynamo",
                         "Qwen/Qwen3-VL-2B-Instruct", now + 1, False, status=200, worker="8",
                         prompt_tokens=317, predictions=[
                             RoutingDecision("dyn-plain", "dynamo", "log:routing_best",
                                             worker="8", overlap_blocks=0, request_blocks=2),
                             RoutingDecision("dyn-plain", "dynamo", "log:mm_fallback",
                                             warnings=[FALLBACK])])
    store.add_traces([warm, plain])
    store.close()
    monkeypatch.setenv("MMLENS_DB", str(path))
    monkeypatch.delenv("MMLENS_CONFIG", raising=False)
    return path


def test_routing_page_shows_dynamo_verdicts_and_fallbacks(dynamo_db: Path) -> None:
    at = open_page("routing")
    assert_clean(at)
    verdicts = next(d for d in frames(at) if "image routing" in d.columns).set_index("model")
    assert verdicts.loc["/models/Qwen3-VL-2B-Instruct", "image routing"] == "exact (pad values)"
    glm = verdicts.loc["/models/GLM-5.3-Flash"]
    assert glm["image routing"] == "text prefix only"
    assert "no image processor registered" in glm["why not"]
    k3 = verdicts.loc["/models/Kimi-K3"]
    assert "segmented encoding" in k3["why not"]
    decisions = drawn_decisions(at).set_index("request")
    assert decisions.loc["dyn-warm", "overlap"] == "19/20"
    assert decisions.loc["dyn-plain", "overlap"] == "0/2"
    assert "expected 206 Partial Content" in decisions.loc["dyn-plain", "warnings"]
