"""Cache: per-worker hit rate over time, available vs achieved (what each request could have
had and why it did not), predicted vs realized per request, KV-event timeline, resident
blocks, and the prefix tree of recent blocks."""

from dataclasses import replace

import streamlit as st
from mmlens.ui import shared
from mmlens.ui.blocks import Static

from mmlens.analysis import kv_divergence
from mmlens.analysis.fleet import KEEP, fold_view_points, fold_view_rows
from mmlens.analysis.views.cache import named_series, named_timeline
from mmlens.analysis.views.common import name_rows, named_headline, router_names, worker_label
from mmlens.figures.availability import achieved_vs_available_figure, avoidable_figure
from mmlens.figures.blocks import caption_html, note_html, pair_html
from mmlens.figures.cache import (
    hit_rate_figure,
    kv_event_timeline_figure,
    predicted_vs_realized_figure,
    prefix_tree_html,
    resident_blocks_figure,
)
from mmlens.figures.kv_divergence import divergence_figure
from mmlens.figures.plain import PlainFigure
from mmlens.figures.svg import bar_chart_html
from mmlens.figures.svg_lines import line_chart_html

st.title("Cache")
path = shared.require_reader()
window = shared.time_window()


@st.fragment(run_every=shared.refresh_every())
def live() -> None:
    with shared.page_guard("Cache"), Static() as block:
        names = shared.worker_names(path)
        rates, step = shared.hit_rates(path, float(window))
        series = named_series(rates, names)
        if series:
            block.add(line_chart_html(hit_rate_figure(series, step)))
        else:
            block.add(note_html("No prefix-cache traffic in this window (vLLM and SGLang "
                                "counters unchanged)."))
        timeline = named_timeline(shared.kv_timeline(path, float(window), window / 60), names)
        left = (bar_chart_html(kv_event_timeline_figure(timeline)) if timeline
                else note_html("No KV events in this window."))
        bars, folded = shared.resident_bars(path)
        right = note_html("No resident-block state yet.")
        if bars:
            right = bar_chart_html(resident_blocks_figure(bars))
            if folded:
                right += caption_html(f"The {len(bars) - 1} workers holding the most blocks, "
                                      f"and the mean of the other {folded}.")
        block.add(pair_html(left, right))
        tree = shared.prefix_tree(path, 200, 500)
        if tree is not None:
            block.flush()
            # SVG first: a tab's first Plotly chart waits for Plotly's code; zooming is a toggle
            if st.toggle("Zoomable prefix tree", key="tree_zoom",
                         help="the same tree in Plotly: click a block to zoom into its chain"):
                st.plotly_chart(PlainFigure(tree), key="prefix_tree", width="stretch")
            else:
                block.add(prefix_tree_html(tree))
        views(block)


VIEW_SOURCES = {
    "source": "event_plane: block sets from the router's event plane; index_gauge: SMG's "
              "smg_kv_index_blocks count; prediction: per request, predicted vs found"}


def views(block: Static) -> None:
    block.heading("Router view vs engine holdings")
    view = kv_divergence.view_model(shared.kv_views(path, float(window)),
                                    shared.recent_traces(path, 500),
                                    shared.recent_verdicts(path, 500))
    if not view.points:
        block.flush()
        st.info("No comparison yet: it needs a router whose index mmlens can see (Dynamo's "
                "event plane, SMG's smg_kv_index_blocks) or traced requests with a router "
                "prediction, beside the engines' own KV events.")
        return
    names = shared.worker_names(path)
    if view.alerts:
        block.flush()
    for alert in view.alerts:
        st.warning(named_headline(alert.message, alert.worker, names))
    block.add(line_chart_html(divergence_figure(fold_view_points(view.points), names)))
    rows = fold_view_rows(view.rows, view.points)
    block.table(name_rows(rows, names), column_help=VIEW_SOURCES)
    block.caption("router only: blocks the router believes resident that the engine no longer "
                  "holds (it evicted them, or the router never heard the removal); engine only: "
                  "blocks the engine holds that the router does not know. Sources: event plane "
                  "(block sets), index gauge (counts), prediction (per request).")
    if len(rows) < len(view.rows):
        workers = len({r["worker"] for r in view.rows})
        block.caption(f"The {KEEP} workers whose views differ most by name, the other "
                      f"{workers - KEEP} summed per source.")
        block.flush()
        if st.toggle(f"Every worker's rows ({len(view.rows)})", key="views_all"):
            shared.small_table(name_rows(view.rows, names), column_help=VIEW_SOURCES)


LOST_HELP = {
    "causes": "avoidable tokens by cause",
    "available": "tokens the best worker held when the router chose",
    "on chosen": "tokens the chosen worker held then",
    "images keyed": "how the router routed the images: exact (by image content, Dynamo), "
                    "degraded (by token ids blind to which image filled them: SMG gRPC, or a "
                    "count drift), text_prefix (on text alone), unknown",
    "identities": "resolved: the engine's name for each image was learned from the blocks it "
                  "stored"}


@st.fragment(run_every=shared.refresh_every())
def available() -> None:
    with shared.page_guard("Cache"), Static() as block:
        block.heading("Available vs achieved")
        view = shared.availability(path, float(window))
        if view.empty:
            block.flush()
            st.info("No request evaluated yet: available vs achieved needs traced requests "
                    "with an expected layout, the workers' KV events and `mmlens collect` "
                    "(which evaluates each request once it ended).")
            return
        block.caption(view.summary())
        routers = router_names(shared.meta(path, "targets"))
        rates = [replace(p, group=routers.get(p.group, p.group)) for p in view.rates]
        block.add(pair_html(
            line_chart_html(achieved_vs_available_figure(rates)),
            bar_chart_html(avoidable_figure(view.avoidable)) if view.avoidable
            else note_html("Nothing avoidable: every request got what the best worker held.")))
        block.flush()
        by = st.radio("Per", ["router", "model", "worker"], horizontal=True, key="avail_by")
        groups = view.group_rows(by)
        names = {"router": routers, "worker": shared.worker_names(path)}.get(by, {})
        block.table([{**g, by: names.get(g[by], g[by])} for g in groups])
        rows = view.rows()
        if rows:
            block.caption("(newest first)", strong="Requests that lost tokens or had a false hit")
            workers = shared.worker_names(path)
            block.table([{**r, "worker": worker_label(r["worker"], workers),
                          "best worker": worker_label(r["best worker"], workers)}
                         for r in rows], column_help=LOST_HELP)


live()
available()

with shared.page_guard("Cache"), Static() as block:
    block.heading("Predicted vs realized, per request")
    traces = shared.recent_traces(path, 500)
    chart = predicted_vs_realized_figure(traces, shared.recent_verdicts(path, 500))
    if not chart.series:
        block.add(note_html("No traced request with a router prediction yet."))
    else:
        block.add(line_chart_html(chart))
        block.caption("Click a point to open that request in the inspector. Points below the "
                      "diagonal: the router expected more cache than the engine found (red: a "
                      "false hit, count drift, fallback or eviction).")
