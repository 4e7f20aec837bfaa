from mmlens.analysis.explain import explain
from mmlens.records import (
    ExpectedLayout,
    KVEventRow,
    LayoutImage,
    LayoutSpan,
    RequestTrace,
    RoutingDecision,
    ViewCount,
)

BS = 16


def t(rid, ts, worker, keys, cached=0, prompt=None, *, expected=None, predicted=None,
      notes=(), error=None, code=None):
    prompt = prompt if prompt is not None else len(keys) * BS + 5
    lay = ExpectedLayout(block_keys=list(keys), engine_prompt_tokens=expected or prompt,
                         router_view=ViewCount(expected or prompt),
                         spans=[LayoutSpan("image", 4, 64, 0)],
                         images=[LayoutImage(64, 64, 64)])
    preds = []
    if predicted is not None or notes:
        preds.append(RoutingDecision(rid, "smg", "test", overlap_blocks=predicted,
                                     warnings=list(notes)))
    return RequestTrace(rid, "http://r", "smg", "m", ts, False, worker=worker,
                        cached_tokens=cached, prompt_tokens=prompt, expected_layout=lay,
                        predictions=preds, error=error, error_code=code,
                        status=400 if error else 200)


def removal(ts, worker, n):
    return KVEventRow(ts, worker, 0, 0, "removed", n)


A = ["a1", "a2", "a3", "a4", "a5"]
B = ["b1", "b2", "b3", "b4", "b5"]


def test_hit():
    seed = t("s", 1, "w1", A)
    e = explain(t("r", 2, "w1", A, cached=64), [seed], BS)
    assert e.category == "hit" and e.best_tokens == 80


def test_cold():
    e = explain(t("r", 2, "w1", A), [t("s", 1, "w1", B)], BS)
    assert e.category == "cold"


def test_content_blind_false_hit():
    e = explain(t("r", 2, "w1", B, predicted=5), [t("s", 1, "w1", A)], BS)
    assert e.category == "false_hit" and "predicted 5 blocks" in e.headline


def test_spilled_names_the_worker_that_held_more():
    e = explain(t("r", 2, "w2", A), [t("s", 1, "w1", A)], BS)
    assert e.category == "spilled" and e.evidence["best_worker"] == "w1"
    assert e.best_tokens == 80 and e.realized_tokens == 0


def test_evicted_when_blocks_were_removed_between_seed_and_replay():
    removed = [removal(1.5, "w1", 5)]
    e = explain(t("r", 2, "w1", A), [t("s", 1, "w1", A)], BS, removed_events=removed)
    assert e.category == "evicted" and e.evidence["removed_blocks_between"] == 5
    later = [removal(3.0, "w1", 5)]
    e = explain(t("r", 2, "w1", A), [t("s", 1, "w1", A)], BS, removed_events=later)
    assert e.category == "unexplained"


def test_count_drift_points_at_the_first_divergent_block():
    e = explain(t("r", 2, "w1", A, prompt=93, expected=85), [t("s", 1, "w1", A)], BS)
    assert e.category == "count_drift" and e.evidence["difference"] == 8
    assert e.evidence["first_divergent_block"] == (4 + 64) // 16


def test_text_prefix_fallback_from_router_warnings():
    e = explain(t("r", 2, "w2", A, notes=["mm-routing: failed to fetch image dims; MM routing "
                                          "entry skipped"]), [t("s", 1, "w1", A)], BS)
    assert e.category == "fallback" and "failed to fetch image dims" in e.headline


def test_events_blind():
    e = explain(t("r", 2, "w2", A), [t("s", 1, "w1", A)], BS, events_unavailable={"w1"})
    assert e.category == "events_blind"


def test_errors_say_what_to_change():
    e = explain(t("r", 2, None, A, error="503", code="no_media_ref_capable_worker"), [], BS)
    assert e.category == "error" and "mm_processor" in e.evidence["what_to_change"]


def test_later_requests_are_not_evidence():
    e = explain(t("r", 2, "w1", A), [t("s", 3, "w1", A)], BS)
    assert e.category == "cold"


def test_no_layout():
    bare = RequestTrace("r", "http://r", "smg", "m", 1, False, worker="w1")
    e = explain(bare, [], BS)
    assert e.category == "no_layout" and e.evidence["layout_error"] is None
    bare.expected_layout = ExpectedLayout.failed("UnknownFamilyError: no family")
    e = explain(bare, [], BS)
    assert e.category == "no_layout" and e.evidence["layout_error"].startswith("Unknown")
