"""Available vs achieved on constructed histories: KV events as a vLLM engine announces them
(full blocks, image identity in ``extra_keys`` under the engine's own identifier), requests
laid out by the core, routing decisions as SMG and Dynamo log them."""

from __future__ import annotations

import xxhash

from mmlens.analysis.availability.facts import facts_of
from mmlens.analysis.availability.tracker import (
    AvailabilityTracker,
    history_summary,
    replay,
    replay_history,
)
from mmlens.ingest.kv_index import ResidentIndex
from mmlens.layout.composition import ImageInput, Layout, SpanKind, compose
from mmlens.layout.expected import ExpectedLayout
from mmlens.layout.families import get_family
from mmlens.layout.hashing import dynamo_pad_value
from mmlens.layout.report import layout_summary
from mmlens.layout.synthetic_images import synthetic_png
from mmlens.layout.tokenizers import family_tokenizer
from mmlens.records import (
    BlockRemoved,
    BlockStored,
    RequestTrace,
    RoutingDecision,
    RoutingScore,
    SpillGate,
)

BS = 16
QWEN3 = get_family("qwen3-vl")
TOK = family_tokenizer("qwen3-vl")
PREFIX = "You are a careful assistant who describes images. " * 3
RED, BLUE = (200, 30, 30), (30, 30, 200)
# 106 engine tokens: 32 of text before the image (2 blocks), the image at 32..95 (blocks 2-5),
# 6 full blocks of which the engine can hit all 6 (the last token is in the partial block 6).
FULL = 6 * BS
TEXT = 2 * BS


def solid_png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    return synthetic_png("solid", width, height, rgb=rgb)


def laid_out(color: tuple[int, int, int]) -> tuple[Layout, dict, ImageInput]:
    image = ImageInput(64, 64, data=solid_png(64, 64, color))
    layout = compose(QWEN3, [PREFIX, image, "Describe this image."], TOK)
    return layout, layout_summary(layout, QWEN3, [image]), image


def engine_stored(layout: Layout, worker: str, ts: float, ident: str, first: int = 0,
                  pad: int | None = None) -> BlockStored:
    """The BlockStored a vLLM-like engine emits for blocks ``first``.. of this prompt; with
    ``pad``, the image run carries that pad value (Dynamo's worker-side form)."""
    tokens = list(layout.engine.token_ids)
    img = next(s for s in layout.engine.spans if s.kind is SpanKind.IMAGE)
    if pad is not None:
        tokens[img.start:img.end] = [pad] * img.length
    n = len(tokens) // BS

    def block_hash(b: int) -> int:
        return xxhash.xxh3_64_intdigest(repr((worker, tokens[:(b + 1) * BS], ident)).encode())

    images = [((ident, img.start - b * BS),) if img.start < (b + 1) * BS and img.end > b * BS
              else None for b in range(first, n)]
    return BlockStored(worker, 0, 0, ts, [block_hash(b) for b in range(first, n)],
                       block_hash(first - 1) if first else None,
                       tokens[first * BS:n * BS], BS, images=images)


def trace(rid: str, summary: dict, ts: float, worker: str, cached: int, prompt: int = 106,
          decisions: list[RoutingDecision] | None = None, kind: str = "smg") -> RequestTrace:
    return RequestTrace(rid, "router", kind, "m", ts, False, status=200, worker=worker,
                        prompt_tokens=prompt, cached_tokens=cached, latency_s=0.5, ttft_s=0.2,
                        expected_layout=ExpectedLayout.from_summary(summary),
                        predictions=decisions or [])


def smg_decision(rid: str, worker: str, overlap: int | None, spill_from: str | None = None,
                 branch: str = "event_hit") -> RoutingDecision:
    gates = [SpillGate(spill_from or worker, 9.0, 1.0, 1.5, 0.0, 0.0, spill_from is not None)]
    return RoutingDecision(rid, "smg", "header:x-smg-cache-trace", worker=worker, branch=branch,
                           overlap_blocks=overlap, request_blocks=6, block_size=BS, gates=gates)


class Cluster:
    """KV events through the ingest's resident index (which computes their content keys)."""

    def __init__(self) -> None:
        self.ingest = ResidentIndex()
        self.tracker = AvailabilityTracker()

    def events(self, *events) -> None:
        self.ingest.apply(events)
        self.tracker.apply(events)

    def evaluate(self, t: RequestTrace):
        facts = facts_of(t)
        assert facts is not None
        return self.tracker.evaluate(facts)


def test_layout_keys_match_the_keys_of_the_engines_blocks() -> None:
    layout, summary, _ = laid_out(RED)
    ident = summary["images"][0]["identity"]["content"]
    ev = engine_stored(layout, "w1", 1.0, ident)
    ResidentIndex().apply([ev])
    assert ev.keys == [int(k, 16) for k in summary["block_keys"]]
    # Another image of the same size: the same token ids, other keys from its first block on.
    _, other, _ = laid_out(BLUE)
    assert other["block_keys"][:2] == summary["block_keys"][:2]
    assert other["block_keys"][2] != summary["block_keys"][2]
    # Dynamo's worker-side form (pad values in the run) keys the blocks the same way.
    padded = engine_stored(layout, "w1", 1.0, ident, pad=dynamo_pad_value(12345))
    ResidentIndex().apply([padded])
    assert padded.keys == ev.keys


def test_sglang_pad_values_name_the_image() -> None:
    layout, summary, _ = laid_out(RED)
    pad = 1_000_000 + 4242
    ev = engine_stored(layout, "s1", 1.0, "unused", pad=pad)
    ev.images = None  # SGLang sends no extra keys: the pad value is the image's name
    ResidentIndex().apply([ev])
    shapes = facts_of(trace("x", summary, 1.0, "s1", 0)).shapes
    assert ev.keys == shapes.keys([f"pad:{pad}"])
    assert ev.images[2] == ((f"pad:{pad}", -1),) and ev.images[1] is None


def test_sglang_worker_learns_its_pad_name() -> None:
    c = Cluster()
    layout, summary, _ = laid_out(RED)
    ev = engine_stored(layout, "s1", 1.2, "unused", pad=1_000_777)
    ev.images = None
    c.events(ev)
    c.evaluate(trace("a1", summary, 1.0, "s1", 0))
    a2 = c.evaluate(trace("a2", summary, 2.0, "s2", 0))
    assert a2.available == {"s1": FULL}


def test_exact_routing_leaves_nothing_avoidable() -> None:
    c = Cluster()
    layout, summary, _ = laid_out(RED)
    ident = summary["images"][0]["identity"]["content"]
    c.events(engine_stored(layout, "w1", 1.2, ident))
    a = c.evaluate(trace("a2", summary, 2.0, "w1", FULL, decisions=[
        smg_decision("a2", "w1", 6)]))
    assert a.available == {"w1": FULL} and a.best_worker == "w1"
    assert (a.best_tokens, a.realized_tokens, a.avoidable_tokens) == (96, 96, 0)
    assert a.causes == {} and a.false_hit_tokens == 0 and a.identities_resolved


def test_forced_load_spill_is_avoidable_with_its_cause() -> None:
    c = Cluster()
    layout, summary, _ = laid_out(RED)
    ident = summary["images"][0]["identity"]["content"]
    c.events(engine_stored(layout, "w1", 1.2, ident))
    a = c.evaluate(trace("a2", summary, 2.0, "w2", 0, decisions=[
        smg_decision("a2", "w2", None, spill_from="w1", branch="spill")]))
    assert (a.best_worker, a.best_tokens, a.chosen_tokens) == ("w1", 96, 0)
    assert a.avoidable_tokens == 96 and a.causes == {"load_spill": 96}


def test_content_blind_false_hit_costs_nothing_when_no_worker_held_the_image() -> None:
    c = Cluster()
    red, red_summary, _ = laid_out(RED)
    _, blue_summary, _ = laid_out(BLUE)
    c.events(engine_stored(red, "w1", 1.2, red_summary["images"][0]["identity"]["content"]))
    b = c.evaluate(trace("b", blue_summary, 2.0, "w1", TEXT, decisions=[
        smg_decision("b", "w1", 6)]))
    assert b.available == {"w1": TEXT} and (b.best_tokens, b.realized_tokens) == (32, 32)
    assert b.avoidable_tokens == 0
    # SMG credited w1 with all 6 blocks (token ids only); it held the 2 text blocks.
    assert (b.predicted_tokens, b.false_hit_tokens, b.false_hit_cause) == (
        96, 64, "content_blind")


def test_content_blind_choice_loses_the_image_held_elsewhere() -> None:
    c = Cluster()
    red, red_summary, _ = laid_out(RED)
    blue, blue_summary, _ = laid_out(BLUE)
    c.events(engine_stored(red, "w1", 1.0, red_summary["images"][0]["identity"]["content"]),
             engine_stored(blue, "w2", 1.1, blue_summary["images"][0]["identity"]["content"]))
    b = c.evaluate(trace("b2", blue_summary, 2.0, "w1", TEXT, decisions=[
        smg_decision("b2", "w1", 6)]))
    assert b.available == {"w1": TEXT, "w2": FULL} and b.best_worker == "w2"
    assert b.avoidable_tokens == 64 and b.causes == {"content_blind": 64}


def test_eviction_between_decision_and_prefill() -> None:
    c = Cluster()
    layout, summary, _ = laid_out(RED)
    stored = engine_stored(layout, "w1", 1.0, summary["images"][0]["identity"]["content"])
    c.events(stored)
    # Decided at 2.0; w1 evicts the image's last two blocks at 2.1; prefill ends at 2.2, when
    # the request stores them again (which must not hide the eviction).
    c.events(BlockRemoved("w1", 0, 1, 2.1, stored.block_hashes[4:]))
    c.events(engine_stored(layout, "w1", 2.2, summary["images"][0]["identity"]["content"],
                           first=4))
    a = c.evaluate(trace("a2", summary, 2.0, "w1", 4 * BS, decisions=[
        smg_decision("a2", "w1", 6)]))
    assert (a.best_tokens, a.chosen_tokens, a.realized_tokens) == (96, 96, 64)
    assert a.causes == {"evicted": 32} and a.avoidable_tokens == 32


def test_stale_index_and_unattributed() -> None:
    c = Cluster()
    layout, summary, _ = laid_out(RED)
    c.events(engine_stored(layout, "w1", 1.0, summary["images"][0]["identity"]["content"]))
    stale = c.evaluate(trace("s", summary, 2.0, "w2", 0, decisions=[smg_decision(
        "s", "w2", 0, branch="expected_wait_fallback")]))
    assert stale.causes == {"stale_index": 96}
    blind = c.evaluate(trace("u", summary, 2.0, "w2", 0))
    assert blind.causes == {"unattributed": 96}
    # SMG in worker mode routes on one anchor per image: its index never holds the engine's
    # image blocks, so not seeing them is content blindness, not a stale index.
    anchored = trace("m", summary, 2.0, "w2", 0, decisions=[smg_decision(
        "m", "w2", 0, branch="expected_wait_fallback")])
    anchored.processing_mode = "worker"
    assert c.evaluate(anchored).causes == {"content_blind": 96}


def test_dynamo_cost_lines_show_a_load_choice() -> None:
    c = Cluster()
    layout, summary, _ = laid_out(RED)
    c.events(engine_stored(layout, "1", 1.0, summary["images"][0]["identity"]["content"]))
    costs = RoutingDecision("d", "dynamo", "log:cost_formula", scores=[
        RoutingScore("cost", "1", 30.0, "cost", device_blocks=6.0),
        RoutingScore("cost", "2", 12.0, "cost", device_blocks=0.0)])
    best = RoutingDecision("d", "dynamo", "log:routing_best", worker="2", overlap_blocks=0,
                           request_blocks=7)
    a = c.evaluate(trace("d", summary, 2.0, "2", 0, decisions=[best, costs], kind="dynamo"))
    assert a.causes == {"load_spill": 96} and a.fidelity == "exact"


def test_a_prediction_the_engine_met_is_no_false_hit() -> None:
    # mmlens saw nothing on w1 (its events were missed), but the engine cached the prompt.
    c = Cluster()
    _, summary, _ = laid_out(RED)
    a = c.evaluate(trace("a", summary, 2.0, "w1", FULL, decisions=[smg_decision("a", "w1", 6)]))
    assert (a.chosen_tokens, a.unseen_tokens, a.false_hit_tokens) == (0, FULL, 0)


def test_engine_identifiers_are_learned_from_what_the_request_stored() -> None:
    # The engine names the image by its own hash, not mmlens' content identity.
    c = Cluster()
    layout, summary, _ = laid_out(RED)
    first = trace("a1", summary, 1.0, "w1", 0)
    c.events(engine_stored(layout, "w1", 1.2, "engine-id-of-red"))
    a1 = c.evaluate(first)
    assert a1.available == {} and a1.identities_resolved
    a2 = c.evaluate(trace("a2", summary, 2.0, "w2", 0, decisions=[
        smg_decision("a2", "w2", None, spill_from="w1", branch="spill")]))
    assert a2.available == {"w1": FULL} and a2.causes == {"load_spill": 96}


def test_the_next_requests_store_just_after_the_service_names_no_image() -> None:
    # vLLM stores a prompt's blocks when it allocates them: the blue request that follows the
    # red one on w1 stores its image 0.1 s after the red one ended, inside the clock slack.
    c = Cluster()
    red, red_summary, _ = laid_out(RED)
    blue, _, _ = laid_out(BLUE)
    c.events(engine_stored(red, "w1", 1.05, "engine-id-of-red"),
             engine_stored(blue, "w1", 1.6, "engine-id-of-blue"))
    a = c.evaluate(trace("a", red_summary, 1.0, "w1", 0))  # served 1.0 .. 1.5
    red_id = red_summary["images"][0]["identity"]["content"]
    assert a.identities_resolved
    assert c.tracker.identities.aliases[red_id] == ["engine-id-of-red"]


def test_unresolved_identity_still_counts_the_text_prefix() -> None:
    c = Cluster()
    layout, summary, _ = laid_out(RED)
    c.events(engine_stored(layout, "w1", 1.2, "engine-id-of-red"))
    a = c.evaluate(trace("x", summary, 2.0, "w2", 0))  # never served on w1: nothing learned
    assert a.available == {"w1": TEXT} and not a.identities_resolved


def test_a_later_store_is_not_available_at_decision_time() -> None:
    c = Cluster()
    layout, summary, _ = laid_out(RED)
    ident = summary["images"][0]["identity"]["content"]
    c.events(engine_stored(layout, "w1", 1.2, ident), engine_stored(layout, "w2", 2.2, ident))
    a = c.evaluate(trace("a", summary, 2.0, "w2", 0))
    assert a.available == {"w1": FULL} and a.causes == {"unattributed": 96}


def test_last_token_block_is_not_cacheable() -> None:
    image = ImageInput(64, 64, data=solid_png(64, 64, RED))
    layout = compose(QWEN3, [PREFIX + "x " * 6, image, "Describe this image."], TOK)
    assert len(layout.engine) == 112  # 7 full blocks, the last prompt token in block 6
    summary = layout_summary(layout, QWEN3, [image])
    c = Cluster()
    c.events(engine_stored(layout, "w1", 1.0, summary["images"][0]["identity"]["content"]))
    a = c.evaluate(trace("a", summary, 2.0, "w1", 96, prompt=112))
    assert (a.best_tokens, a.realized_tokens, a.avoidable_tokens) == (96, 96, 0)
    assert a.not_cacheable_tokens == 16


def test_count_drift_is_named() -> None:
    c = Cluster()
    layout, summary, _ = laid_out(RED)
    c.events(engine_stored(layout, "w1", 1.0, summary["images"][0]["identity"]["content"]))
    a = c.evaluate(trace("a", summary, 2.0, "w2", 0, prompt=109, decisions=[
        smg_decision("a", "w2", 0, branch="event_miss")]))
    assert a.causes == {"count_drift": 96}


def test_replay_orders_events_and_requests() -> None:
    layout, summary, _ = laid_out(RED)
    ident = summary["images"][0]["identity"]["content"]
    events = [engine_stored(layout, "w1", 1.2, ident), engine_stored(layout, "w2", 3.2, ident)]
    ResidentIndex().apply(events)
    reqs = [facts_of(trace("a1", summary, 1.0, "w1", 0)),
            facts_of(trace("a2", summary, 3.0, "w2", 0))]
    out = {a.request_id: a for a in replay(events, [r for r in reqs if r])}
    assert out["a1"].available == {} and out["a2"].available == {"w1": FULL}


def test_history_model_from_the_requests_alone() -> None:
    _, red_summary, _ = laid_out(RED)
    _, blue_summary, _ = laid_out(BLUE)
    reqs = [facts_of(trace("r1", red_summary, 1.0, "w1", 0)),
            facts_of(trace("b1", blue_summary, 2.0, "w2", 0)),
            facts_of(trace("r2", red_summary, 3.0, "w2", TEXT))]
    out = {a.request_id: a for a in replay_history([r for r in reqs if r])}
    assert out["r2"].available == {"w1": FULL, "w2": TEXT}
    assert out["r2"].avoidable_tokens == 64 and out["r2"].causes == {"unattributed": 64}


def test_aggregates_are_token_and_block_weighted() -> None:
    from mmlens.analysis.availability.aggregate import (
        Cells,
        avoidable_per_minute,
        headline,
        headlines,
        hit_rates,
    )
    from mmlens.records import Availability

    def row(rid, ts, router, prompt, best, realized, causes=None, predicted=None, images=1,
            fidelity="degraded"):
        return Availability(rid, ts, router, "smg", "m", "w1", 16, prompt, images, fidelity,
                            {}, "w1", best, best, realized, sum((causes or {}).values()),
                            causes or {}, predicted_tokens=predicted)

    rows = [row("a", 0.0, "r1", 100, 96, 96, predicted=96),
            row("b", 30.0, "r1", 1000, 960, 0, {"load_spill": 960}, predicted=0),
            row("c", 70.0, "r2", 50, 32, 32, images=0, fidelity="unknown")]
    cells = Cells.of(rows)
    h = headline(cells, window_s=120.0)
    # Token-weighted: 128 / 1150, not the mean of the per-request ratios (0.96, 0, 0.64).
    assert h.achieved == 128 / 1150 and h.available == 1088 / 1150
    assert h.avoidable_tokens == 960 and h.causes == {"load_spill": 960}
    assert h.avoidable_per_minute == 480.0
    # Block-weighted over the two predicted requests: 7 + 63 request blocks.
    assert h.predicted_blocks_ratio == 6 / 70 and h.realized_blocks_ratio == 6 / 70
    assert h.image_routing == {"exact": 0.0, "degraded": 1.0, "text_prefix": 0.0,
                               "unknown": 0.0}
    points = {(p.group, p.t): p for p in hit_rates(cells, "router", 60.0)}
    assert points[("r1", 0.0)].achieved == 96 / 1100 and points[("r2", 60.0)].available == 32 / 50
    assert avoidable_per_minute(cells, 60.0) == [(0.0, "load_spill", 960.0)]
    assert set(headlines(cells, "router")) == {"r1", "r2"}
    # Summed per group in one pass: the same as each group's cells alone.
    for window in (None, 120.0):
        assert headlines(cells, "router", window) == {
            r: headline(cells.where(cells.router.codes == cells.router.names.index(r)), window)
            for r in ("r1", "r2")}
    # Cells of many requests give the same totals as one cell per request.
    merged = Cells.from_columns({"t": [0.0], "router": ["r1"], "model": ["m"], "worker": ["w1"],
                                 **{k: [int(v.sum())] for k, v in Cells.of(rows[:2]).sums.items()}})
    assert headline(merged, 120.0) == headline(Cells.of(rows[:2]), 120.0)


def test_scenario_history_totals() -> None:


    _, summary, _ = laid_out(RED)
    per, total = history_summary([
        trace("a1", summary, 1.0, "w1", 0),
        trace("a2", summary, 2.0, "w2", 0, decisions=[
            smg_decision("a2", "w2", None, spill_from="w1", branch="spill")])])
    assert per["a2"].causes == {"load_spill": 96}
    assert total["avoidable_tokens"] == 96 and total["causes"] == {"load_spill": 96}
    assert total["available_tokens"] == 96 and total["requests"] == 2


def test_history_behind_dynamo_keys_images_by_url() -> None:
    """Dynamo names an image by the XXH3 of its URL string: the same bytes by another URL
    are another image to its workers, so the history model offers only the text prefix."""
    png = solid_png(64, 64, RED)

    def by_url(url: str) -> dict:
        image = ImageInput(64, 64, data=png, url=url)
        layout = compose(QWEN3, [PREFIX, image, "Describe this image."], TOK)
        return layout_summary(layout, QWEN3, [image])

    one, other = by_url("http://127.0.0.1:9/one.png"), by_url("http://127.0.0.1:9/two.png")
    assert one["block_keys"] == other["block_keys"]  # mmlens' content identity: the bytes
    per, _ = history_summary([trace("d1", one, 1.0, "1", 0, kind="dynamo"),
                              trace("d2", other, 2.0, "2", 0, kind="dynamo"),
                              trace("d3", one, 3.0, "2", 0, kind="dynamo")])
    assert per["d2"].available == {"1": TEXT}
    assert per["d3"].available == {"1": FULL, "2": TEXT}
