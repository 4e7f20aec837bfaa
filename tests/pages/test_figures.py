"""The pure pieces behind the pages: request views, figures (inspected as go.Figure / JSON),
time series, affinity, overview alerts, lab plans, targets TOML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from mmlens.analysis.affinity import image_affinity, multi_resident, sankey_links, worker_image_sets
from mmlens.analysis.overview import alerts, headline
from mmlens.analysis.request_view import fold_images, from_layout, from_trace
from mmlens.analysis.timeseries import deltas, ratio_series
from mmlens.analysis.views.affinity import multi_resident_rows, worker_rows
from mmlens.analysis.views.cache import resident_bars
from mmlens.figures.affinity import affinity_sankey
from mmlens.figures.cache import (
    hit_rate_figure,
    kv_event_timeline_figure,
    predicted_vs_realized_figure,
    prefix_tree_figure,
    resident_blocks_figure,
)
from mmlens.figures.routing import mode_reason_figure
from mmlens.figures.token_layout import layout_figure
from mmlens.ingest.metrics_normalize import HitRate, NormalizedMetrics
from mmlens.layout.composition import ImageInput, Span, SpanKind
from mmlens.layout.modeldir import resolve_model
from mmlens.records import (
    ExpectedLayout,
    ImageInfo,
    KVEventRow,
    LayoutImage,
    LayoutSpan,
    RequestTrace,
    ResidentSummary,
    RoutingDecision,
    ViewCount,
)
from mmlens.state import Snapshot
from mmlens.targets_toml import config_toml_from_ready, validate_toml
from tests.pages.apptest_util import sankey_links_drawn
from tests.verdicts_support import judged

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def qwen3():
    return resolve_model("qwen3-vl")


def test_fold_images_turns_each_run_into_one_anchor() -> None:
    spans = (Span(SpanKind.TEXT, 0, 4), Span(SpanKind.IMAGE, 4, 64, 0),
             Span(SpanKind.TEXT, 68, 13))
    assert fold_images(spans) == (Span(SpanKind.TEXT, 0, 4), Span(SpanKind.ANCHOR, 4, 1, 0),
                                  Span(SpanKind.TEXT, 5, 13))


def test_layout_figure_rows_blocks_and_hashes(qwen3) -> None:
    layout = qwen3.layout([ImageInput(640, 480), "hi"], block_size=16)
    rv = from_layout(layout, ["f" * 64])
    fig = layout_figure(rv)
    rows = {t.name: t for t in fig.data}
    assert rows["image 0 · ffffffff"].x == (300,)
    assert rows["image 0 · ffffffff"].y == ("router view (311)",)
    assert rows["anchor"].y == ("worker view (12)",)
    # One grid line per full block of the router view (311 → 19 full blocks).
    assert len(fig.layout.shapes) == 19
    hover = rows["blocks"].hovertext
    assert sum("router view block" in h for h in hover) == 20
    assert "partial, 7/16: never cached" in hover[19]
    assert "extra_keys ffffffff@-12" in hover[1]  # image starts at 4: block 1 offset 4−16
    json.loads(fig.to_json())


def test_layout_legend_sits_below_the_axis_title_at_any_height(qwen3) -> None:
    """The legend's top is the same pixel distance under the plot for two rows or five: as
    a share of the plot height it overlapped the x axis title on short charts."""
    from mmlens.figures.token_layout import LEGEND_GAP_PX

    one = from_layout(qwen3.layout([ImageInput(640, 480), "hi"], block_size=16))
    gaps = []
    for rv in (one, from_layout(qwen3.layout([ImageInput(640, 480), "hi"], block_size=16,
                                             engine_count_drift=2))):
        lay = layout_figure(rv).layout
        assert lay.legend.yanchor == "top" and lay.legend.y < 0
        plot_px = lay.height - lay.margin.t - lay.margin.b
        gaps.append(round(-lay.legend.y * plot_px))
        # the margin holds the gap and a legend of three rows, so Plotly does not grow it
        # (a grown margin would shrink the plot and the gap with it)
        assert lay.margin.b >= LEGEND_GAP_PX + 3 * 24
    assert gaps == [LEGEND_GAP_PX, LEGEND_GAP_PX] and LEGEND_GAP_PX >= 50


def test_engine_drift_marks_first_divergent_block(qwen3) -> None:
    layout = qwen3.layout([ImageInput(640, 480), "hi"], block_size=16, engine_count_drift=2)
    rv = from_layout(layout)
    assert [(d.block, d.reason) for d in rv.divergences] == [(19, "count_drift")]
    fig = layout_figure(rv)
    assert any("block 19: count_drift" in a.text for a in fig.layout.annotations)
    image = next(t for t in fig.data if t.name == "image 0 · ?")
    assert dict(zip(image.y, image.x, strict=True)) == {"router view (311)": 300,
                                                        "engine view (313)": 302}


def test_trace_without_text_uses_summary_spans() -> None:
    lay = ExpectedLayout(block_size=16, images=[LayoutImage(64, 64, 64)],
                         anchor_view=ViewCount(18), router_view=ViewCount(81),
                         worker_view=ViewCount(18), engine_prompt_tokens=81,
                         spans=[LayoutSpan("text", 0, 4), LayoutSpan("image", 4, 64, 0),
                                LayoutSpan("text", 68, 13)],
                         block_keys=[f"{k:016x}" for k in range(5)])
    trace = RequestTrace("r", "http://r", "smg", "m", 1.0, False, prompt_tokens=84,
                         worker="w", expected_layout=lay,
                         images=[ImageInfo("data", 155, 64, 64, {"smg_blake3": "ab" * 32})],
                         predictions=[RoutingDecision("r", "smg", "header", overlap_blocks=5,
                                                      block_size=16)])
    rv = from_trace(trace)
    assert [r.name for r in rv.rows] == ["router view (81)", "worker view (18)"]
    # Without the prompt text the stored content keys stand in for block hashes on hover.
    assert rv.rows[0].block_keys == tuple(lay.block_keys)
    hover = next(t for t in layout_figure(rv).data if t.name == "blocks")
    assert any("content key 0000000000000004" in h for h in hover.hovertext)
    reasons = {d.reason: d for d in rv.divergences}
    # 84 observed vs 81 expected: the image run differs, so from block (4+64)//16 = 4 on.
    assert reasons["count_drift"].block == 4
    assert "content-blind" in reasons["image_identity"].detail
    assert rv.notes


def test_predicted_vs_realized_carries_request_ids() -> None:
    from mmlens.figures.svg_lines import line_chart_html
    from tests.pages.apptest_util import lines_drawn

    traces = [RequestTrace("a", "r", "smg", "m", 1.0, False, cached_tokens=80,
                           prompt_tokens=81, predictions=[RoutingDecision(
                               "a", "smg", "header", overlap_blocks=5, block_size=16)]),
              RequestTrace("b", "r", "smg", "m", 2.0, False, prompt_tokens=81)]
    traces.append(RequestTrace("c", "r", "smg", "m", 3.0, False, cached_tokens=0,
                               prompt_tokens=81, predictions=[RoutingDecision(
                                   "c", "smg", "header", overlap_blocks=5, block_size=16)]))
    drawn = lines_drawn(line_chart_html(predicted_vs_realized_figure(traces, judged(traces))))
    hits, misses = drawn["data"]
    # One point per request with a prediction; the false hit (predicted 80, found 0) is a red
    # series of its own, and every point opens its request in the inspector.
    assert (hits["ids"], hits["x"], hits["y"]) == (["a"], [80.0], [80.0])
    assert (misses["ids"], misses["x"], misses["y"]) == (["c"], [80.0], [0.0])
    assert misses["links"] == ["inspector?request=c"]
    assert misses["hover"][0].splitlines() == ["c", "worker None", "predicted 80, cached 0 "
                                               "of 81", "false_hit"]
    root = ET.fromstring(line_chart_html(predicted_vs_realized_figure(traces, judged(traces))))
    fills = {g.get("data-series"): g.find(f".//{SVG}circle").get("fill")  # type: ignore[union-attr]
             for g in root.iter(f"{SVG}g") if g.get("data-series")}
    assert fills["a miss the router did not expect"] == "#cf1124" != fills["requests"]
    # The two points lie on one scale: (80, 80) on the dotted diagonal, (80, 0) on the axis.
    (a,) = [c for c in root.iter(f"{SVG}circle") if c.get("fill") != "#cf1124"]
    (c,) = [c for c in root.iter(f"{SVG}circle") if c.get("fill") == "#cf1124"]
    diagonal = next(ln for ln in root.iter(f"{SVG}line") if ln.get("stroke-dasharray"))
    assert a.get("cx") == c.get("cx")
    assert float(c.get("cy", "0")) == pytest.approx(float(diagonal.get("y1", "0")), abs=0.1)
    slope = (float(diagonal.get("y2", "0")) - float(diagonal.get("y1", "0"))) / (
        float(diagonal.get("x2", "0")) - float(diagonal.get("x1", "0")))
    x0, y0 = float(diagonal.get("x1", "0")), float(diagonal.get("y1", "0"))
    assert float(a.get("cy", "0")) == pytest.approx(y0 + slope * (float(a.get("cx", "0")) - x0),
                                                    abs=0.2)


def test_kv_timeline_removed_blocks_point_down() -> None:
    import xml.etree.ElementTree as ET

    from mmlens.figures.svg import bar_chart_html

    chart = kv_event_timeline_figure([(0.0, "w1", "stored", 10), (0.0, "w1", "removed", 4),
                                      (0.0, "w2", "stored", 3), (30.0, "w1", "stored", 2)])
    by_name: dict[str, list[float]] = {}
    for b in chart.bars:
        by_name.setdefault(b.series, []).append(b.value)
    # Every worker has a removed entry: none removed reads as 0, not as a missing series.
    assert by_name == {"w1 stored (12)": [10, 2], "w1 removed (4)": [-4],
                       "w2 stored (3)": [3], "w2 removed (0)": [0]}
    assert [name for name, _ in chart.legend] == list(by_name)
    assert chart.stacked and chart.signed and chart.slots == ("00:00:00", "00:00:30")
    # As drawn: a bucket's stored blocks stack up from the zero line, its removed ones down.
    svg = "{http://www.w3.org/2000/svg}"
    root = ET.fromstring(bar_chart_html(chart))
    zero = min(float(line.get("y1", "0")) for line in root.iter(f"{svg}line")
               if line.get("stroke") == "#5c6f82")
    rects = {(g.get("data-series"), g.get("data-label")): g.find(f"{svg}rect")
             for g in root.iter(f"{svg}g") if g.get("data-series")}

    def span(series: str, label: str = "00:00:00") -> tuple[float, float]:
        r = rects[(series, label)]
        y, h = float(r.get("y", "0")), float(r.get("height", "0"))
        return y, y + h

    assert span("w1 stored (12)")[1] == pytest.approx(zero, abs=0.1)
    assert span("w2 stored (3)")[1] == pytest.approx(span("w1 stored (12)")[0], abs=0.1)
    assert span("w1 removed (4)")[0] == pytest.approx(zero, abs=0.1)
    assert span("w1 removed (4)")[1] > zero + 10  # 4 blocks down: drawn, below the line


def test_hit_rate_lines_break_at_gaps_and_name_every_worker() -> None:
    from mmlens.figures.svg_lines import line_chart_html
    from tests.pages.apptest_util import lines_drawn

    t0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
    markup = line_chart_html(hit_rate_figure(
        {"w1": [(t0, 0.95), (t0 + 10, 0.9), (t0 + 300, 0.0)]}, step=10.0))
    (line,) = lines_drawn(markup)["data"]
    assert line["name"] == "w1" and line["y"] == [0.95, 0.9, 0.0]  # a lone worker is named
    assert line["hover"][0] == "08:00:00 UTC · w1: 95.0%"
    # 95% → 90%, then a pause of 29 steps: the line breaks instead of sloping to 0%.
    assert line["path"].count("M") == 2 and line["path"].split("M")[1].count("L") == 1
    root = ET.fromstring(markup)
    labels = [t.text for t in root.iter(f"{SVG}text")]
    assert {"08:00", "08:05", "0%", "100%", "UTC"} <= set(labels)  # level UTC ticks
    assert not any(t.get("transform") for t in root.iter(f"{SVG}text")
                   if t.text and ":" in t.text)
    assert "w1" in "".join(root.itertext())  # the legend


def test_svg_line_points_are_to_scale() -> None:
    from mmlens.figures.svg_lines import LineChart, Series, line_chart_html, segments
    from tests.pages.apptest_util import lines_drawn

    # A missing value breaks a line as a long pause does.
    assert segments([(0, 1.0), (10, None), (20, 2.0), (30, 3.0)], 10.0) == [
        [(0, 1.0)], [(20, 2.0), (30, 3.0)]]
    chart = LineChart("t", (Series("s", ((0.0, 0.25), (60.0, 0.75)), "#000"),), percent=True)
    root = ET.fromstring(line_chart_html(chart))
    y_of = {t.text: float(t.get("y", "0")) - 4 for t in root.iter(f"{SVG}text")
            if t.text and t.text.endswith("%")}
    cy = [float(c.get("cy", "0")) for c in root.iter(f"{SVG}circle")][:2]
    assert cy == [pytest.approx(y_of["25%"], abs=0.1), pytest.approx(y_of["75%"], abs=0.1)]
    assert lines_drawn(line_chart_html(chart))["data"][0]["x"] == [0.0, 60.0]


def test_points_at_one_place_are_drawn_once_naming_each() -> None:
    from mmlens.figures.svg_lines import LineChart, Series, line_chart_html
    from tests.pages.apptest_util import lines_drawn

    chart = LineChart("t", (Series("s", ((1.0, 1.0), (2.0, 0.0), (1.0, 1.0)), "#000",
                                   hovers=("a", "b", "c"), ids=("a", "b", "c"),
                                   links=("?a", "?b", "?c"), line=False),), time_axis=False)
    markup = line_chart_html(chart)
    assert len(list(ET.fromstring(markup).iter(f"{SVG}circle"))) == 2
    (drawn,) = lines_drawn(markup)["data"]
    assert drawn["ids"] == ["a", "c", "b"] and drawn["x"] == [1.0, 1.0, 2.0]
    assert drawn["hover"][0] == "a\n(and 1 more at this point)" and drawn["links"][0] == "?a"


def test_a_long_line_keeps_every_point_and_fewer_tooltips() -> None:
    from mmlens.figures.svg_lines import MAX_MARKED, LineChart, Series, line_chart_html
    from tests.pages.apptest_util import lines_drawn

    points = tuple((float(t), float(t % 7)) for t in range(600))
    chart = LineChart("t", (Series("s", points, "#000"),
                            Series("few", ((0.0, 1.0), (599.0, 2.0)), "#111")))
    long, few = lines_drawn(line_chart_html(chart))["data"]
    assert long["path"].count("L") == 599  # the line is drawn through all 600 points
    assert len(long["x"]) <= MAX_MARKED + 1 and long["x"][0] == 0 and long["x"][-1] == 599
    assert long["y"] == [t % 7 for t in long["x"]]  # each tooltip at its own point
    root = ET.fromstring(line_chart_html(chart))
    visible = [c for c in root.iter(f"{SVG}circle") if c.get("fill-opacity") != "0"]
    assert len(visible) == 2  # the long line's markers dropped, the short one's kept
    assert few["x"] == [0.0, 599.0]


def test_prefix_tree_as_svg_bands_to_scale() -> None:
    from mmlens.figures.cache import prefix_tree_html
    from tests.pages.apptest_util import icicle_drawn

    # Worker w: chain 1 → 2 → {3, 4} (two leaves) and chain 5 (one leaf), 3 leaves in all.
    events = [KVEventRow(1.0, "w", 0, 0, "stored", 2, None, [1, 2], ["x"]),
              KVEventRow(2.0, "w", 0, 1, "stored", 1, 2, [3], []),
              KVEventRow(3.0, "w", 0, 2, "stored", 1, 2, [4], []),
              KVEventRow(4.0, "w", 0, 3, "stored", 1, None, [5], [])]
    drawn = icicle_drawn(prefix_tree_html(prefix_tree_figure(events).to_dict()))
    band = dict(zip(drawn["ids"], drawn["rect"], strict=True))
    assert dict(zip(drawn["ids"], drawn["leaves"], strict=True)) == {
        "worker w": 3, "w/1": 2, "w/2": 2, "w/3": 1, "w/4": 1, "w/5": 1}
    assert dict(zip(drawn["ids"], drawn["parents"], strict=True))["w/3"] == "w/2"
    _, _, _, whole = band["worker w"]
    assert band["w/1"][3] == pytest.approx(whole * 2 / 3, abs=1.0)
    # children side by side in the next column, inside their parent's band, in order
    assert band["w/3"][0] > band["w/2"][0] and band["w/3"][1] == pytest.approx(band["w/2"][1])
    assert band["w/4"][1] == pytest.approx(band["w/3"][1] + band["w/3"][3] + 1, abs=0.1)
    assert band["w/5"][1] == pytest.approx(band["w/1"][1] + band["w/1"][3] + 1, abs=0.1)
    assert drawn["hover"][drawn["ids"].index("w/1")].splitlines()[0] == "0000000000000001"
    assert drawn["text"][0] == "worker w"


def test_prefix_tree_svg_draws_only_the_shown_levels() -> None:
    from mmlens.figures.cache import SHOWN_LEVELS, prefix_tree_html
    from tests.pages.apptest_util import icicle_drawn

    events = [KVEventRow(1.0, "w", 0, 0, "stored", 20, None, list(range(1, 21)), [])]
    drawn = icicle_drawn(prefix_tree_html(prefix_tree_figure(events).to_dict()))
    assert len(drawn["ids"]) == SHOWN_LEVELS  # the worker and six blocks; deeper not drawn
    assert max(x + w for x, _, w, _ in drawn["rect"]) == pytest.approx(1000, abs=1)


def test_prefix_tree_links_chains_and_marks_images() -> None:
    events = [KVEventRow(1.0, "w", 0, 0, "stored", 2, None, [1, 2], ["x"]),
              KVEventRow(2.0, "w", 0, 1, "stored", 1, 2, [3], [])]
    tree = prefix_tree_figure(events).data[0]
    parent = dict(zip(tree.ids, tree.parents, strict=True))
    assert parent == {"worker w": "", "w/1": "worker w", "w/2": "w/1", "w/3": "w/2"}
    colors = dict(zip(tree.ids, tree.marker.colors, strict=True))
    assert colors["w/1"] != colors["w/3"]
    # Labels keep a readable size: one that does not fit its tile is hidden (the hover names
    # it), never shrunk to a few pixels; fewer levels at once leave each one wider.
    lay = prefix_tree_figure(events).layout
    assert lay.uniformtext.mode == "hide" and lay.uniformtext.minsize >= 11
    assert tree.maxdepth is not None and tree.maxdepth <= 8


def test_affinity_and_sankey() -> None:
    img = ImageInfo("data", 10, 64, 64, {"smg_blake3": "aa" * 32})
    other = ImageInfo("data", identities={"smg_blake3": "bb" * 32})

    def t(worker, ts, images, error=None):
        return RequestTrace(f"r{ts}", "r", "smg", "m", ts, False, worker=worker,
                            images=images, error=error)

    traces = [t("w1", 1.0, [img]), t("w1", 2.0, [img]), t("w2", 3.0, [img, other]),
              t(None, 4.0, [img], "x")]
    aff = image_affinity(traces)
    assert aff[0].requests == 3 and aff[0].stuck_ratio == pytest.approx(2 / 3)
    assert (aff[0].first_seen, aff[0].last_seen) == (1.0, 3.0)
    links = sankey_links(aff)
    sankey = sankey_links_drawn(affinity_sankey(links, worker_names={"w2": "second"}))
    assert sum(sankey["value"]) == 4
    assert sankey["nodes"][-2:] == ["w1", "second"]  # images first, then workers by URL
    assert sorted(zip(sankey["target"], sankey["value"], strict=True)) == [
        ("second", 1), ("second", 1), ("w1", 2)]
    assert multi_resident([ResidentSummary("w1", 0, images={"x": 1}),
                           ResidentSummary("w2", 0, images={"x": 2, "y": 0})]) == {
        "x": ["w1", "w2"]}


def test_residency_rows_label_only_the_workers_a_cell_lists(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On 1,000 workers holding 40 images each, the residency tables are what labelling every
    worker gave (the page's rows before), while labelling at most 8 workers per image."""
    from mmlens.analysis.views import affinity as views

    state = [ResidentSummary(f"grpc://h:{i}", 0, images={f"img{k}": 1 + k % 3
                                                         for k in range(i % 7, 40 + i % 7)})
             for i in range(1000)]
    names = {"grpc://h:3": "w3"}
    several, sets = multi_resident(state), worker_image_sets(state)
    labelled = [{"image": k[:16], "copies": len(v), "workers": views.listed(
                    [views.worker_label(w, names) for w in v])}
                for k, v in sorted(several.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
    per_worker = [{"worker": views.worker_label(w, names), "images": len(imgs),
                   "image blocks": sum(imgs.values()),
                   "identifiers": views.listed([k[:8] for k in imgs])}
                  for w, imgs in sets.items()]
    calls = []
    real = views.worker_label
    monkeypatch.setattr(views, "worker_label", lambda w, n=None: calls.append(w) or real(w, n))
    assert multi_resident_rows(several, names) == labelled
    assert len(calls) == views.LISTED * len(several)
    assert labelled[0]["workers"].endswith(f" +{labelled[0]['copies'] - views.LISTED} more")
    assert worker_rows(sets, names) == per_worker


def test_fleet_residency_rows_and_bars_stay_small() -> None:
    """On 30 workers holding one image each and one image everywhere, a table cell names 8
    workers and says how many more, and the resident bars are the 12 fullest workers by name
    and the other 18 workers' mean."""
    state = [ResidentSummary(f"grpc://h:{i}", 0, resident_blocks=i,
                             images={"all": 2, **{f"img{k}": 1 for k in range(i % 3)}})
             for i in range(30)]
    names = {"grpc://h:0": "w0"}
    (row, *rest) = multi_resident_rows(multi_resident(state), names)
    assert row["image"] == "all" and row["copies"] == 30
    assert row["workers"].startswith("w0, h:1, h:10, ") and row["workers"].endswith(" +22 more")
    assert [r["copies"] for r in rest] == [20, 10]  # img0 on i % 3 in (1, 2), img1 on 2
    widest = max(worker_rows(worker_image_sets(state)), key=lambda r: r["images"])
    assert widest["images"] == 3 and "+" not in widest["identifiers"]
    bars, folded = resident_bars(state, names)
    assert folded == 18 and len(bars) == 13
    assert [b[1] for b in bars[:12]] == list(range(29, 17, -1))
    assert bars[-1] == ("18 other workers (mean)", sum(range(18)) / 18,
                        2 + sum(i % 3 for i in range(18)) / 18)
    chart = resident_blocks_figure(bars)
    assert chart.slots[-1] == "18 other workers (mean)" and len(chart.bars) == 2 * len(bars)
    small, none_folded = resident_bars(state[:3], names)
    assert none_folded == 0 and [b[0] for b in small] == ["w0", "h:1", "h:2"]


def test_ratio_series_handles_resets() -> None:
    assert deltas([(0, 10), (5, 14), (10, 3)]) == [(5, 4), (10, 3)]
    hits = [(0, 0), (10, 5), (20, 1)]
    queries = [(0, 0), (10, 10), (20, 4)]
    assert ratio_series(hits, queries, 10) == [(10, 0.5), (20, 0.25)]


def test_mode_reason_figure_one_trace_per_mode_reason() -> None:
    fig = mode_reason_figure({("smg", "m", "router", "auto_mixed"): [(0.0, 3.0)],
                              ("smg", "m", "worker", "auto_uniform"): [(0.0, 2.0)]})
    assert [name for name, _ in fig.legend] == ["router / auto_mixed · m",
                                                "worker / auto_uniform · m"]
    assert fig.stacked and [b.value for b in fig.bars] == [3.0, 2.0]


def test_overview_alerts_block_size_and_unhealthy() -> None:
    snap = Snapshot(router_state=[{"router": "smg", "workers": [
        {"url": "w1", "kv_block_size": 16, "healthy": True},
        {"url": "w2", "kv_block_size": 64, "healthy": False, "status": "failed"}]}],
        metrics=NormalizedMetrics(
            hit_rates=[HitRate("w1", "w1", "m", "vllm", 30.0, 60.0, 10.0, 0.5, 0.5, 0.5)],
            mm_processing=[{"mode": "worker", "count": 3.0}, {"mode": "router", "count": 1.0}]))
    causes = {a.cause for a in alerts(snap, [], 0.0)}
    assert {"block_size_mismatch", "worker_unhealthy"} <= causes
    head = headline(snap, [])
    assert head.engine_hit_rate == 0.5 and head.worker_mode_share == 0.75


def test_targets_toml_from_ready_round_trips() -> None:
    ready = {"event": "ready", "router": "http://127.0.0.1:1", "router_metrics":
             "http://127.0.0.1:2/metrics", "workers": [
                 {"name": "w1", "url": "grpc://127.0.0.1:3", "metrics":
                  "http://127.0.0.1:4/metrics", "kv_events": "tcp://127.0.0.1:5",
                  "kv_replay": "tcp://127.0.0.1:6", "kv_topic": "kv-events"}]}
    cfg = validate_toml(config_toml_from_ready(ready))
    assert cfg.routers[0].url == "http://127.0.0.1:1"
    assert cfg.workers[0].router_url == "grpc://127.0.0.1:3"
    assert cfg.workers[0].topic == "kv-events"


def test_targets_toml_from_a_two_router_demo() -> None:
    """The SMG demo's router-mode and worker-mode routers over the same workers."""
    ready = {"event": "ready", "router": "http://127.0.0.1:1", "routers": [
        {"name": "demo", "url": "http://127.0.0.1:1", "metrics": "http://127.0.0.1:2/metrics",
         "log": "smg.log", "mm_processing": "router"},
        {"name": "demo-worker", "url": "http://127.0.0.1:3", "metrics":
         "http://127.0.0.1:4/metrics", "log": "smg-worker.log", "mm_processing": "worker"}],
        "workers": [{"name": "w1", "url": "grpc://127.0.0.1:5"}]}
    cfg = validate_toml(config_toml_from_ready(ready))
    assert [(r.name, r.url) for r in cfg.routers] == [
        ("demo", "http://127.0.0.1:1"), ("demo-worker", "http://127.0.0.1:3")]
    assert cfg.routers[1].log_file and cfg.routers[1].log_file.endswith("smg-worker.log")
    assert [w.router_url for w in cfg.workers] == ["grpc://127.0.0.1:5"]


def test_targets_toml_from_a_dynamo_ready_line() -> None:
    ready = {"event": "ready", "router_kind": "dynamo", "router": "http://127.0.0.1:1",
             "router_metrics": "http://127.0.0.1:1/metrics", "router_log": "frontend.log",
             "workers": [{"name": "w1", "worker_id": "5064877435218370466",
                          "metrics": "http://127.0.0.1:2/metrics"}]}
    cfg = validate_toml(config_toml_from_ready(ready))
    assert cfg.routers[0].kind == "dynamo"
    assert cfg.routers[0].log_file and cfg.routers[0].log_file.endswith("frontend.log")
    assert cfg.workers[0].router_url == "5064877435218370466"


def test_dynamo_trace_hashes_router_blocks_with_pad_values(qwen3) -> None:
    from mmlens.layout.hashing import dynamo_routing

    layout = qwen3.layout([ImageInput(64, 64), "hi"], block_size=16)
    trace = RequestTrace("d", "http://r", "dynamo", "m", 1.0, False,
                         prompt_tokens=len(layout.engine), images=[ImageInfo(
                             "http", None, 64, 64, {"dynamo_mm_hash_url": "00000000000000ff"})])
    rv = from_trace(trace, layout)
    assert rv.rows[0].block_hashes == dynamo_routing(layout, [0xFF]).block_hashes
    assert any("Dynamo" in n for n in rv.notes)
    # mm_hash 0xFF → pad value 1_000_000 + 255, named on the image and in the routing note.
    assert rv.image_labels[0].endswith("pad 1000255")
    (note,) = [n for n in rv.notes if n.startswith("Dynamo's routing view")]
    assert "image 0 → 1000255" in note and "zero-padded to 80" in note


def test_each_worker_has_one_colour_on_every_chart() -> None:
    from mmlens.analysis.kv_divergence import ViewPoint
    from mmlens.figures.cache import worker_hit_rate_bars
    from mmlens.figures.kv_divergence import divergence_figure
    from mmlens.figures.workers import PALETTE, worker_colour

    assert worker_colour("w1") == PALETTE[0] and worker_colour("w2") == PALETTE[1]
    assert worker_colour("w2#1") == PALETTE[1]  # a DP rank of w2 is still w2
    assert worker_colour("prefill-a") == worker_colour("prefill-a")  # stable for any name
    lines = hit_rate_figure({"w1": [(1.0, 0.5)], "w2": [(1.0, 0.2)]}).series
    kv = kv_event_timeline_figure([(1.0, "w2", "stored", 4), (1.0, "w1", "stored", 2)])
    bars = worker_hit_rate_bars([HitRate("a", "grpc://a", "m", "vllm", 1, 2, 60.0, 0.5, 0.5,
                                         0.5), HitRate("b", "grpc://b", "m", "vllm", 1, 4,
                                                       60.0, 0.25, 0.25, 0.25)],
                                {"grpc://a": "w1", "grpc://b": "w2"}).bars
    views = divergence_figure([ViewPoint(1.0, "w2", "index_gauge", 4, 4, 0, 0)]).series
    w2 = worker_colour("w2")
    assert [line.colour for line in lines] == [worker_colour("w1"), w2]
    stored = {b.series.split(" ")[0]: b.colour for b in kv.bars if " stored " in b.series}
    assert stored == {"w1": worker_colour("w1"), "w2": w2}
    assert [b.colour for b in bars] == [worker_colour("w1"), w2]
    assert views[0].colour == w2
    assert not {"#cf1124", "#d1495b"} & set(PALETTE)  # red means a miss, never a worker
def test_prefix_tree_counts_blocks_below_the_visible_depth_on_one_node() -> None:
    from mmlens.figures.cache import VISIBLE_DEPTH

    long = list(range(1, 65))  # one 64-block chain, then a chain continuing it
    events = [KVEventRow(1.0, "w", 0, 0, "stored", 64, None, long, []),
              KVEventRow(2.0, "w", 0, 1, "stored", 2, 64, [100, 101], [])]
    tree = prefix_tree_figure(events).data[0]
    parent = dict(zip(tree.ids, tree.parents, strict=True))
    shown = [f"w/{h}" for h in long[:VISIBLE_DEPTH]]
    assert [parent[n] for n in shown[1:]] == shown[:-1]
    tail = f"{shown[-1]}/+"
    assert parent[tail] == shown[-1] and len(tree.ids) == 1 + VISIBLE_DEPTH + 1
    # the 52 deeper blocks and the 2 that continue the chain below them
    assert tree.text[list(tree.ids).index(tail)] == f"+{64 - VISIBLE_DEPTH + 2} blocks"


def test_time_bars_keep_their_width_and_ticks_never_repeat() -> None:
    from mmlens.figures.availability import avoidable_figure

    early = mode_reason_figure({("demo", "m", "router", "auto"): [(0.0, 2), (30.0, 1)]})
    # Ten minutes on, two more buckets: the quiet intervals between are empty slots (the bars
    # keep one bucket's width, and time is not squeezed), each slot its own clock time.
    late = mode_reason_figure({("demo", "m", "router", "auto"): [
        (0.0, 2), (30.0, 1), (570.0, 1), (600.0, 3)]})
    assert early.slots == ("00:00:00", "00:00:30")
    assert len(late.slots) == 21 and len(set(late.slots)) == 21
    assert [b.label for b in late.bars] == ["00:00:00", "00:00:30", "00:09:30", "00:10:00"]
    # One bucket alone is one bucket wide, not a slab across the chart.
    one = avoidable_figure([(60.0, "content_blind", 320.0)])
    assert one.slots == ("00:01",) and one.bars[0].value == 320.0


def test_fleet_hit_rate_bars_show_the_lowest_workers() -> None:
    from mmlens.figures.cache import MAX_WORKER_BARS, worker_hit_rate_bars

    rates = [HitRate("r", f"grpc://w{i}", "m", "vllm", i, 100, 60.0, i / 100, i / 100, i / 100)
             for i in range(100)]
    chart = worker_hit_rate_bars(rates[::-1])
    assert len(chart.bars) == MAX_WORKER_BARS
    assert [b.label for b in chart.bars[:2]] == ["grpc://w0", "grpc://w1"]
    assert max(b.value for b in chart.bars) == (MAX_WORKER_BARS - 1) / 100
    assert "of 100 workers" in chart.title


def test_svg_bar_chart_draws_each_bar_to_scale_with_its_text_escaped() -> None:
    import xml.etree.ElementTree as ET

    from mmlens.figures.svg import Bar, BarChart, bar_chart_html

    chart = BarChart("hit <rate> & more", (Bar("w<1>", 0.5, "50%", 'tip "a" & b', "#123456"),
                                           Bar("w2", 1.0, "100%", "", "#654321")), percent=True)
    markup = bar_chart_html(chart)
    assert "\n" not in markup  # one line: Markdown keeps it a raw HTML block
    root = ET.fromstring(markup)  # well formed: every text escaped
    assert root.get("data-chart-title") == "hit <rate> & more"
    svg = "{http://www.w3.org/2000/svg}"
    groups = [g for g in root.iter(f"{svg}g") if g.get("data-label") is not None]
    assert [g.get("data-label") for g in groups] == ["w<1>", "w2"]
    assert groups[0].findtext(f"{svg}title") == 'tip "a" & b'
    assert groups[1].findtext(f"{svg}title") == "w2: 100%"  # no tooltip given: label and text
    heights = [float(g.find(f"{svg}rect").get("height")) for g in groups]  # type: ignore[union-attr]
    assert heights[1] == pytest.approx(2 * heights[0], rel=1e-3)
    fills = [g.find(f"{svg}rect").get("fill") for g in groups]  # type: ignore[union-attr]
    assert fills == ["#123456", "#654321"]
    ticks = [t.text for t in root.iter(f"{svg}text") if t.get("text-anchor") == "end"]
    assert ticks[:5] == ["0%", "25%", "50%", "75%", "100%"]
    # many bars: the labels slant (and the numbers above them go: they would overlap)
    many = BarChart("t", tuple(Bar(f"worker-{i}", i, str(i)) for i in range(40)))
    texts = list(ET.fromstring(bar_chart_html(many)).iter(f"{svg}text"))
    assert sum("rotate(-40)" in (t.get("transform") or "") for t in texts) == 40
    assert not any(t.text == "39" and not t.get("transform") for t in texts)


def test_layout_svg_draws_the_figure_s_spans_and_block_tooltips(qwen3) -> None:
    import xml.etree.ElementTree as ET

    from mmlens.figures.layout_svg import layout_svg_html

    layout = qwen3.layout([ImageInput(640, 480), "hi"], block_size=16, engine_count_drift=2)
    rv = from_layout(layout, ["f" * 64])
    svg = "{http://www.w3.org/2000/svg}"
    root = ET.fromstring(layout_svg_html(rv, "t <&>"))
    spans = [(g.get("data-series"), g.get("data-row"), int(g.get("data-length", "-1")))
             for g in root.iter(f"{svg}g") if g.get("data-series")]
    fig = layout_figure(rv)
    assert spans == [(t.name, row, x) for t in fig.data if t.type == "bar"
                     for row, x in zip(t.y, t.x, strict=True)]
    tips = [g.findtext(f"{svg}title") for g in root.iter(f"{svg}g") if g.get("data-block-row")]
    hover = next(t for t in fig.data if t.name == "blocks").hovertext
    assert tips == [h.replace("<br>", "\n") for h in hover]
    assert "partial" in tips[19] and "hash " in tips[1] and "extra_keys ffffffff" in tips[1]
    labels = [t.get("data-annotation") for t in root.iter(f"{svg}text")
              if t.get("data-annotation")]
    assert labels == ["block 19: count_drift"]
    assert root.get("data-chart-title") == "t <&>"
