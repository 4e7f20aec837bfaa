import pytest

from mmlens.analysis import scenarios as sc
from mmlens.analysis.judgement.batch import JudgeState
from mmlens.layout.families import get_family
from mmlens.records import ExpectedLayout, RequestTrace, RoutingDecision

QWEN3 = get_family("qwen3-vl")
CTX = sc.Context(block_size=16, model_family="qwen3-vl",
                 count_of=lambda w, h: QWEN3.image_token_count(w, h))


def trace(rid, worker, prompt, cached, *, starts=(4,), tokens=(300,), predicted=None,
          expected=None, status=200, error=None):
    spans = [{"kind": "text", "start": 0, "length": starts[0], "image_index": None}]
    for i, (s, n) in enumerate(zip(starts, tokens, strict=True)):
        spans.append({"kind": "image", "start": s, "length": n, "image_index": i})
    layout = ExpectedLayout.from_summary({
        "spans": spans, "engine_prompt_tokens": prompt if expected is None else expected,
        "images": [{"width": 64, "height": 64, "tokens": n} for n in tokens]})
    t = RequestTrace(rid, "http://r", "smg", "m", 0.0, False, status=status, worker=worker,
                     prompt_tokens=prompt, cached_tokens=cached, expected_layout=layout,
                     error=error)
    if predicted is not None:
        t.predictions.append(RoutingDecision(rid, "smg", "header", worker=worker,
                                             overlap_blocks=predicted))
    return t


def plan(name):
    return {s.name: s for s in sc.build(CTX)}[name]


def test_every_named_scenario_has_a_plan():
    assert [s.name for s in sc.build(CTX)] == list(sc.NAMES)


def test_repeat_passes_when_warm_and_fails_when_cold():
    ok = [trace("a", "w1", 317, 0), trace("b", "w1", 317, 304), trace("c", "w1", 317, 304)]
    assert sc.judge(plan("repeat"), CTX, ok).verdict == "pass"
    cold = [trace("a", "w1", 317, 0), trace("b", "w2", 317, 0), trace("c", "w2", 317, 304)]
    result = sc.judge(plan("repeat"), CTX, cold)
    assert result.verdict == "fail" and "different workers" in result.summary


def test_affinity_reports_seeds_on_one_worker_without_failing():
    same = [trace("a", "w1", 317, 0), trace("b", "w1", 317, 0), trace("a2", "w1", 317, 304),
            trace("b2", "w1", 317, 304)]
    result = sc.judge(plan("affinity"), CTX, same)
    assert result.verdict == "pass" and result.evidence["seeds_on_one_worker"]
    moved = [trace("a", "w1", 317, 0), trace("b", "w2", 317, 0), trace("a2", "w2", 317, 0),
             trace("b2", "w2", 317, 304)]
    assert sc.judge(plan("affinity"), CTX, moved).verdict == "fail"


def test_isolation_reports_a_content_blind_false_hit():
    traces = [trace("a", "w1", 317, 304), trace("b", "w1", 317, 0, predicted=19)]
    result = sc.judge(plan("isolation"), CTX, traces)
    assert result.verdict == "pass"
    assert result.evidence["content_blind_false_hit"] is True
    assert "false hit" in result.summary
    leaky = [trace("a", "w1", 317, 304), trace("b", "w1", 317, 304)]
    assert sc.judge(plan("isolation"), CTX, leaky).verdict == "fail"


def test_straddle_needs_the_blocks_before_the_second_image():
    starts, tokens = (4, 310), (300, 300)
    seed = trace("s", "w1", 620, 0, starts=starts, tokens=tokens)
    good = trace("t", "w1", 620, 304, starts=starts, tokens=tokens)
    bad = trace("t", "w1", 620, 288, starts=starts, tokens=tokens)
    assert sc.judge(plan("straddle"), CTX, [seed, good]).verdict == "pass"
    assert sc.judge(plan("straddle"), CTX, [seed, bad]).verdict == "fail"


def test_straddling_sizes_are_not_block_multiples():
    a, b = sc.straddling_sizes(CTX.count_of, 16)
    assert QWEN3.image_token_count(*a) % 16 and QWEN3.image_token_count(*b) % 16


def test_staircase_must_climb_evenly():
    up = [trace(str(i), "w1", 120 * (i + 1), c) for i, c in enumerate([0, 96, 192])]
    assert sc.judge(plan("staircase"), CTX, up).verdict == "pass"
    flat = [trace(str(i), "w1", 120 * (i + 1), c) for i, c in enumerate([0, 96, 96])]
    assert sc.judge(plan("staircase"), CTX, flat).verdict == "fail"
    uneven = [trace(str(i), "w1", 120 * (i + 1), c) for i, c in enumerate([0, 16, 192])]
    assert sc.judge(plan("staircase"), CTX, uneven).verdict == "fail"


@pytest.mark.parametrize(("cached", "keyed"), [
    ((0, 208, 208), "image content"), ((0, 0, 0), "the URL string"), ((0, 208, 0), "mixed")])
def test_identity_reports_how_identity_is_keyed(cached, keyed):
    traces = [trace(str(i), "w1", 210, c) for i, c in enumerate(cached)]
    result = sc.judge(plan("identity"), CTX, traces)
    assert result.verdict == "pass" and keyed in result.evidence["keyed_by"]


def test_identity_is_inconclusive_when_the_router_refuses_urls():
    traces = [trace("0", "w1", 210, 0), trace("1", None, None, 0, status=400, error="private"),
              trace("2", None, None, 0, status=400, error="private")]
    assert sc.judge(plan("identity"), CTX, traces).verdict == "inconclusive"


def test_parity_explains_count_drift():
    drift = [trace("p", "w1", 902, 0, tokens=(880,), expected=894)]
    scenario = sc.Scenario("parity", "", plan("parity").requests[:1], sc.judge_parity)
    result = sc.judge(scenario, CTX, drift)
    assert result.verdict == "fail"
    assert "+8 tokens" in result.summary and "blocks from 55" in result.summary
    same = [trace("p", "w1", 894, 0, tokens=(880,))]
    result = sc.judge(scenario, CTX, same)
    assert result.verdict == "pass" and "worker mode not exercised" in result.summary


def test_failed_requests_make_a_scenario_inconclusive():
    traces = [trace("a", None, None, 0, status=503, error="no worker")] * 3
    result = sc.judge(plan("repeat"), CTX, traces)
    assert result.verdict == "inconclusive" and "no worker" in result.summary


def test_salt_changes_colours_only():
    a, b = sc.build(CTX, 0), sc.build(CTX, 7)
    assert [s.name for s in a] == [s.name for s in b]
    assert a[0].requests[0].images[0].color != b[0].requests[0].images[0].color
    assert a[0].requests[0].images[0].width == b[0].requests[0].images[0].width


def test_html_report_is_self_contained():
    from mmlens.figures.report_html import render

    traces = [trace("a", "w1", 317, 0), trace("b", "w1", 317, 304), trace("c", "w1", 317, 304)]
    html = render([sc.judge(plan("repeat"), CTX, traces)], "report", {"router": "r"})
    assert "<script" in html and "src=\"http" not in html and "Plotly" in html
    assert "repeat" in html and "pass" in html


def test_rows_carry_miss_explanations():
    a, b = trace("a", "w1", 317, 304), trace("b", "w1", 317, 0, predicted=19)
    a.ts, b.ts = 1.0, 2.0
    a.expected_layout.block_keys = ["k-red-0", "k-red-1"]
    b.expected_layout.block_keys = ["k-blue-0", "k-blue-1"]
    # The rows show the stored verdicts (judged by the one judgement, as the job does).
    verdicts = {v.request_id: v for v in JudgeState().judge([a, b], ["a", "b"])}
    rows = sc.judge(plan("isolation"), CTX, [a, b], verdicts).requests
    assert rows[1]["explanation"].startswith("false_hit: ")
    assert rows[0]["explanation"].startswith("false_hit") is False
    # Not judged yet: pending, never a guess of the scenario's own.
    rows = sc.judge(plan("isolation"), CTX, [a, b], {"a": verdicts["a"]}).requests
    assert rows[1]["explanation"].startswith("pending: ")
