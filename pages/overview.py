"""Overview: targets and their health, headline numbers, alerts that name their cause."""

import time

import pandas as pd
import streamlit as st
from mmlens.ui import shared

from mmlens.analysis.availability.view import CAUSE_TEXT, AvailabilityView
from mmlens.analysis.views.common import name_rows, named_text, pct
from mmlens.analysis.views.overview import mark_routers_down, overview_view
from mmlens.figures.cache import worker_hit_rate_bars

st.title("Overview")
path = shared.require_reader()


@st.fragment(run_every=shared.REFRESH_S)
def live() -> None:
    with shared.page_guard("Overview"):
        snap = shared.snapshot(path)
        workers_seen = shared.worker_view(path)
        view = overview_view(snap, workers_seen.alerts, time.time())
        if not view.has_data or view.headline is None:
            st.info("No data yet: the collectors have not reported. Targets appear after "
                    "their first scrape (a few seconds).")
            return
        head = view.headline
        c1, c2, c3, c4 = st.columns(4)
        c1.metric("Engine hit rate (token-weighted)", pct(head.engine_hit_rate),
                  help="Σ prefix-cache hit tokens / Σ queried tokens over the last 5 min, "
                       "from the workers' counters (never a per-batch gauge)")
        c2.metric("Router-predicted hit rate", pct(head.predicted_hit_rate),
                  help=f"predicted cached tokens / prompt tokens over "
                       f"{head.predicted_requests} recent traced requests")
        c3.metric("Image requests in router mode", pct(head.router_mode_share),
                  help=f"smg_mm_processing_total, {head.image_requests:.0f} requests")
        c4.metric("Image requests in worker mode", pct(head.worker_mode_share))
        available(shared.availability(path, 3600.0))

        names = shared.worker_names(path)
        st.subheader("Alerts")
        found = view.alerts
        if not found:
            st.success("No alerts: KV events flow, predictions match what the engines found, "
                       "block sizes agree, workers are healthy.")
        for a in found:
            box = {"error": st.error, "warning": st.warning}.get(a.severity, st.info)
            box(f"**{a.cause}** — {named_text(a.message, names)}")
            if a.request_id:
                st.page_link("pages/inspector.py", label=f"Explain {a.request_id}",
                             icon=":material/view_timeline:",
                             query_params={"request": a.request_id})

        st.subheader("Targets")
        if snap.latest_sample_ts is None:
            st.warning("No metrics scraped yet: the router or the workers may be down.")
        st.caption(f"Prometheus: {view.prometheus}" if view.prometheus else
                   "Prometheus: not configured (metrics are scraped directly from /metrics).")
        if view.targets:
            st.dataframe(pd.DataFrame(view.targets), hide_index=True, width="stretch")
        if view.shards:
            st.markdown("**Collector shards** (`mmlens collect --shard I/N`)")
            st.dataframe(pd.DataFrame(view.shards), hide_index=True, width="stretch")
        for name in view.routers_down:
            st.error(f"Router {name} is down or unreachable: its /workers did not answer.")
        if view.router_workers:
            st.markdown("**Workers as the router lists them**")
            st.dataframe(pd.DataFrame(name_rows(view.router_workers, names)), hide_index=True,
                         width="stretch")
        if workers_seen.rows:
            st.markdown("**Workers: liveness (from the routers' own series) and where their KV "
                        "events come from**")
            rows = mark_routers_down(name_rows(workers_seen.rows, names), view.routers_down)
            st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
        if snap.metrics.hit_rates:
            st.plotly_chart(worker_hit_rate_bars(snap.metrics.hit_rates, names),
                            key="overview_hit_rates", width="stretch")


def available(view: AvailabilityView) -> None:
    """Achieved vs available ("speed of light") and what was lost, over the last hour."""
    h = view.headline
    if view.empty:
        st.caption("Available vs achieved: no request evaluated yet (it needs traced requests "
                   "with an expected layout, the workers' KV events and `mmlens collect`).")
        return
    c1, c2, c3 = st.columns(3)
    c1.metric("Achieved vs available hit rate", f"{pct(h.achieved)} of {pct(h.available)}",
              help=f"Σ cached / Σ prompt tokens against Σ tokens the best worker held when the "
                   f"router chose, over {h.requests} requests in the last hour")
    per_min = "—" if h.avoidable_per_minute is None else f"{h.avoidable_per_minute:,.0f}"
    c2.metric("Avoidable prefill tokens / min", per_min,
              help=f"{h.avoidable_tokens} tokens the best worker held that the request did not "
                   "get (the last-token block excluded)")
    top = view.top_cause()
    c3.metric("Top cause", top or "none",
              help=CAUSE_TEXT.get(top or "", "nothing avoidable") +
              "; details on the Cache page")


live()
