"""Routing: processing mode and reason over time, cache-aware branches, Dynamo event
statuses, recent decisions, strict-mode errors with what to change."""

import streamlit as st
from mmlens.ui import shared

from mmlens.analysis.routing_table import dynamo_verdict_rows, strict_mode_rows
from mmlens.analysis.views.common import router_names, verdict_counts
from mmlens.analysis.views.routing import (
    MODE_SERIES,
    applied_events,
    decision_table,
    mode_reason_series,
    mode_totals,
    routers_of_kind,
)
from mmlens.figures.routing import branches_figure, dynamo_events_figure, mode_reason_figure
from mmlens.figures.svg import bar_chart_html

st.title("Routing")
path = shared.require_reader()
window = shared.time_window()


@st.fragment(run_every=shared.refresh_every())
def live() -> None:
    with shared.page_guard("Routing"):
        metrics = shared.router_metrics(path)
        traces = shared.recent_traces(path, 200)
        verdicts_of = shared.recent_verdicts(path, 200)
        series = mode_reason_series(shared.samples(path, (MODE_SERIES,), float(window)))
        if series:
            shared.chart(bar_chart_html(mode_reason_figure(series)))
        elif metrics.mm_processing:
            st.info("No image requests in this window; totals since the router started: "
                    + mode_totals(metrics))
        elif routers_of_kind(shared.meta(path, "targets"), "smg"):
            st.info("No `smg_mm_processing_total` yet: no image request has reached an SMG "
                    "router (or the router's metrics are not scraped).")
        if metrics.cache_aware_branches:
            shared.chart(bar_chart_html(branches_figure(metrics.cache_aware_branches)))
        applied = applied_events(metrics)
        if applied:
            shared.chart(bar_chart_html(dynamo_events_figure(applied)))

        verdicts = shared.meta(path, "dynamo_mm_routing") or {}
        if verdicts:
            st.subheader("Dynamo: image-aware routing per model")
            shared.small_table(dynamo_verdict_rows(verdicts))
            st.caption("From the frontend's `mm_routing` log at model registration. Per-request "
                       "fallbacks (e.g. image dims not fetched) appear under warnings below.")

        st.subheader("Recent decisions")
        names = shared.worker_names(path)
        misses_only = st.toggle("Misses only", key="routing_misses_only",
                                help="requests whose verdict is a miss: false hit, count "
                                     "drift, fallback, eviction, spill, cold or error")
        routers = router_names(shared.meta(path, "targets"))
        everything = decision_table(traces, verdicts_of, names, routers=routers)
        decisions = decision_table(traces, verdicts_of, names, misses_only, routers)
        if decisions:
            st.caption(verdict_counts([r["verdict"] for r in everything]))
            shared.linked_request_table(decisions, column_help={
                "why": "the verdict's reason: the router's prediction against what the engine "
                       "found",
                "candidates": "workers the router considered, with their load",
                "scores": "SMG: affinity (cached blocks) and expected wait (s); Dynamo: cost "
                          "per worker (lower wins)",
                "gates": "SMG spill gate: spill to the least-loaded worker when load > "
                         "average × relative and load > average + absolute"})
            st.caption("Candidates, scores and gates come from SMG's cache trace "
                       "(`SMG_CACHE_TRACE=1` log lines, followed by `mmlens collect`) and "
                       "Dynamo's routing log; the `x-smg-cache-trace` header alone names only "
                       "the chosen worker and its prediction.")
            shared.decision_detail(traces, key="routing_decision", names=names)
        elif everything:
            st.success("No misses among the recent requests.")
        else:
            st.info("No traced requests yet: send some from the Lab page.")

        st.subheader("Strict-mode and routing errors")
        errors = strict_mode_rows(traces)
        if errors:
            shared.small_table(errors)
        else:
            st.caption("No request failed with a routing or multimodal-processing error.")


live()
