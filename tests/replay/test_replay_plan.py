"""Planning a replay from a recorded window: timing scaled, image bytes that keep the
recorded identities' equalities, synthetic text of the recorded length (the stored text when
kept), and what cannot be rebuilt counted by reason."""

from __future__ import annotations

import itertools

import pytest
from mmlens.collectors.trace_sink import SentRequest, TraceSink

from mmlens.layout.imageinfo import probe_image
from mmlens.layout.modeldir import resolve_model
from mmlens.layout.sent import ImagePart
from mmlens.records import RequestTrace
from mmlens.replay.images import identity_png
from mmlens.replay.plan import PlannedRequest, plan
from mmlens.replay.text import TextFitter, fit_words
from tests.replay.support import DESCRIBE, HAIKU, RED, mixed_traces, recorded, sent


@pytest.fixture(scope="module")
def fitter() -> TextFitter:
    return TextFitter(resolve_model("qwen3-vl"))


def test_image_bytes_follow_the_identity() -> None:
    a = identity_png("5f4a", 640, 480)
    assert a == identity_png("5f4a", 640, 480)
    assert a != identity_png("5f4b", 640, 480)
    assert (probe_image(a).width, probe_image(a).height) == (640, 480)
    # Tiny images carry what of the digest fits; two identities still differ in the first pixel.
    assert identity_png("x", 1, 1) != identity_png("y", 1, 1)
    with pytest.raises(ValueError):
        identity_png("x", 0, 4)


def test_fit_lands_on_the_length_or_says_it_did_not() -> None:
    def words(text: str) -> int:
        return len(text.split())

    fit = fit_words("k", 40, lambda text: words(text) + 5)  # 5 template tokens, 1 a word
    assert fit.exact and fit.tokens == 40 and words(fit.text) == 35
    assert fit_words("k", 40, lambda text: words(text) + 5) == fit  # deterministic
    assert fit_words("j", 40, lambda text: words(text) + 5).text != fit.text
    # Two tokens a word after 5 cannot make an even length: the closest, said to be inexact.
    odd = fit_words("k", 40, lambda text: 2 * words(text) + 5)
    assert not odd.exact and abs(odd.tokens - 40) == 1
    short = fit_words("k", 3, lambda text: words(text) + 5)  # below the template alone
    assert not short.exact and short.tokens == 5


def _replayed_layout(p: PlannedRequest) -> RequestTrace:
    t = RequestTrace(request_id="x", router="r", router_kind="smg", model="m", ts=0,
                     stream=False)
    TraceSink(layout_model="qwen3-vl").describe(t, SentRequest(p.text, [
        ImagePart(identity_png(im.identity, im.width, im.height)) for im in p.images]))
    return t


def _common_blocks(a: list[str], b: list[str]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def test_the_replay_keeps_every_pair_s_shared_prefix(fitter: TextFitter) -> None:
    traces = mixed_traces()
    p = plan(recorded(traces), fitter)
    by_id = {t.request_id: t for t in traces}
    assert [r.source_id for r in p.requests] == [
        "red", "red-again", "blue", "haiku", "plot", "haiku-again", "red-hd"]
    keys = {}
    for r in p.requests:
        lay = by_id[r.source_id].expected_layout
        assert lay is not None and lay.router_view is not None and lay.block_keys is not None
        replayed = _replayed_layout(r).expected_layout
        assert replayed is not None and replayed.router_view is not None
        assert replayed.router_view.token_count == lay.router_view.token_count == r.fitted_tokens
        assert r.text_source == "synthetic" and r.text not in (DESCRIBE, HAIKU)
        keys[r.source_id] = (lay.block_keys, replayed.block_keys)
    # Content keys are what the engines' caches match on: for every pair, the replayed
    # prompts share as many leading blocks as the recorded ones did.
    for a, b in itertools.combinations(keys, 2):
        (rec_a, rep_a), (rec_b, rep_b) = keys[a], keys[b]
        assert _common_blocks(rep_a, rep_b) == _common_blocks(rec_a, rec_b), (a, b)
    assert _common_blocks(*[keys[k][1] for k in ("red", "red-again")]) == len(keys["red"][1])
    assert _common_blocks(*[keys[k][1] for k in ("red", "blue")]) == 0


def test_what_cannot_be_rebuilt_is_counted_by_reason(fitter: TextFitter) -> None:
    p = plan(recorded(mixed_traces()), fitter)
    assert p.skipped == {"failed when recorded": 1, "image size unknown": 1,
                         "prompt length unknown": 1}
    assert p.approximations == {}
    r = {q.source_id: q for q in p.requests}
    assert r["red-again"].recorded_cached == 304 and r["red-again"].max_tokens == 12


def test_timing_is_scaled_by_the_speed(fitter: TextFitter) -> None:
    p = plan(recorded(mixed_traces()), fitter, speed=2.0)
    assert [r.offset_s for r in p.requests] == [0.0, 0.5, 1.0, 1.5, 1.75, 2.0, 2.5]
    assert p.recorded_span_s == 5.0
    assert p.asked_rate == pytest.approx(6 / 2.5)
    with pytest.raises(ValueError):
        plan([], fitter, speed=0)


def test_stored_text_is_sent_as_stored(fitter: TextFitter) -> None:
    traces = [sent("kept", 0.0, DESCRIBE, [RED], keep_text=True)]
    texts = {t.request_id: t.expected_layout.text for t in traces
             if t.expected_layout is not None and t.expected_layout.text is not None}
    p = plan(recorded(traces), fitter, texts=texts, model="other", max_tokens=3)
    (r,) = p.requests
    assert (r.text, r.text_source, r.model, r.max_tokens) == (DESCRIBE, "stored", "other", 3)
    assert r.fitted_tokens == r.prompt_tokens


def test_a_request_without_block_keys_gets_a_text_of_its_own(fitter: TextFitter) -> None:
    traces = [sent(rid, i, HAIKU, []) for i, rid in enumerate(("a", "b"))]
    for t in traces:
        assert t.expected_layout is not None
        t.expected_layout.block_keys = t.expected_layout.block_shapes = None
    p = plan(recorded(traces), fitter)
    assert p.approximations == {"text identity unknown (a new text each)": 2}
    assert p.requests[0].text != p.requests[1].text
    assert p.requests[0].fitted_tokens == p.requests[0].prompt_tokens
