"""Overview: targets and their health, headline numbers, alerts that name their cause."""

import time

import streamlit as st
from mmlens.ui import shared

from mmlens.analysis.alert_states import TrackedAlert, counts
from mmlens.analysis.availability.view import CAUSE_TEXT, AvailabilityView
from mmlens.analysis.views.common import by_worker_name, clock, name_rows, named_text, pct
from mmlens.analysis.views.overview import mark_routers_down, overview_view
from mmlens.figures.cache import worker_hit_rate_bars
from mmlens.figures.metric_row import Metric
from mmlens.figures.svg import bar_chart_html

st.title("Overview")
path = shared.require_reader()


@st.fragment(run_every=shared.refresh_every())
def live() -> None:
    with shared.page_guard("Overview"):
        snap = shared.snapshot(path)
        workers_seen = shared.worker_view(path)
        view = overview_view(snap, workers_seen.alerts, time.time())
        if not view.has_data or view.headline is None:
            st.info("No data yet: the collectors have not reported. Targets appear after "
                    "their first scrape (a few seconds).")
            return
        for severity, text in view.store_notes:
            {"error": st.error, "warning": st.warning}.get(severity, st.info)(text)
        head = view.headline
        shared.metrics(
            Metric("Engine hit rate (token-weighted)", pct(head.engine_hit_rate),
                   "Σ prefix-cache hit tokens / Σ queried tokens over the last 5 min, from "
                   "the workers' counters (never a per-batch gauge)"),
            Metric("Router-predicted hit rate", pct(head.predicted_hit_rate),
                   f"predicted cached tokens / prompt tokens over {head.predicted_requests} "
                   "recent traced requests"),
            Metric("Image requests in router mode", pct(head.router_mode_share),
                   f"smg_mm_processing_total, {head.image_requests:.0f} requests"),
            Metric("Image requests in worker mode", pct(head.worker_mode_share)))
        available(shared.availability(path, float(shared.time_window())))

        names = shared.worker_names(path)
        alert_panel(shared.tracked_alerts(path, view.alerts), names)

        st.subheader("Targets")
        if snap.latest_sample_ts is None:
            st.warning("No metrics scraped yet: the router or the workers may be down.")
        st.caption(f"Prometheus: {view.prometheus}" if view.prometheus else
                   "Prometheus: not configured (metrics are scraped directly from /metrics).")
        if view.targets:
            rows = [{**r, "target": named_text(str(r["target"]), names)} for r in view.targets]
            shared.small_table(rows)
        if view.shards:
            st.markdown("**Collector shards** (`mmlens collect --shard I/N`)")
            shared.small_table(view.shards)
        for name in view.routers_down:
            st.error(f"Router {name} is down or unreachable: its /workers did not answer.")
        if view.router_workers:
            st.markdown("**Workers as the router lists them**")
            shared.small_table(by_worker_name(name_rows(view.router_workers, names)))
        if workers_seen.rows:
            st.markdown("**Workers: liveness (from the routers' own series) and where their KV "
                        "events come from**")
            rows = mark_routers_down(by_worker_name(name_rows(workers_seen.rows, names)),
                                     view.routers_down)
            shared.small_table(rows)
        if snap.metrics.hit_rates:
            shared.chart(bar_chart_html(worker_hit_rate_bars(snap.metrics.hit_rates, names)))


def alert_panel(tracked: list[TrackedAlert], names: dict[str, str]) -> None:
    """Firing alerts first (worst first), each with the requests behind it; then pending and
    recently resolved ones, quietly."""
    n = counts(tracked)
    st.subheader("Alerts")
    st.caption(f"{n['firing']} firing · {n['pending']} pending · {n['resolved']} resolved in "
               "the last 5 min. An alert fires once its condition has held for its hold time "
               "(view comparisons 30 s; a judged request at once).")
    if not n["firing"]:
        st.success("Nothing firing: KV events flow, predictions match what the engines found, "
                   "block sizes agree, workers are healthy.")
    for t in tracked:
        g = t.group
        text = "  \n".join(named_text(a.message, names) for a in g.alerts)
        if t.state == "firing":
            box = {"error": st.error, "warning": st.warning}.get(g.severity, st.info)
            box(f"**{g.cause}** · firing since {clock(t.since)} UTC — {text}")
            ids = g.request_ids
            if ids:
                st.page_link("pages/inspector.py", label=f"Explain {ids[0]}",
                             icon=":material/view_timeline:", query_params={"request": ids[0]})
            if len(ids) > 1:
                st.markdown("Also behind it: " + ", ".join(
                    f"[{rid}]({shared.inspector_link(rid)})" for rid in ids[1:]))
        elif t.state == "pending":
            st.caption(f"pending {time.time() - t.since:.0f} of {t.hold_s:.0f} s · "
                       f"**{g.cause}** — {text}")
        else:
            st.caption(f"resolved at {clock(t.since)} UTC · **{g.cause}** — {text}")


def available(view: AvailabilityView) -> None:
    """Achieved vs available ("speed of light") and what was lost, over the time range."""
    h = view.headline
    if view.empty:
        st.caption("Available vs achieved: no request evaluated yet (it needs traced requests "
                   "with an expected layout, the workers' KV events and `mmlens collect`).")
        return
    per_min = "—" if h.avoidable_per_minute is None else f"{h.avoidable_per_minute:,.0f}"
    top = view.top_cause()
    shared.metrics(
        Metric("Achieved vs available hit rate", f"{pct(h.achieved)} of {pct(h.available)}",
               f"Σ cached / Σ prompt tokens against Σ tokens the best worker held when the "
               f"router chose, over {h.requests} requests in the time range"),
        Metric("Avoidable prefill tokens / min", per_min,
               f"{h.avoidable_tokens} tokens the best worker held that the request did not "
               "get (the last-token block excluded)"),
        Metric("Top cause", top or "none",
               CAUSE_TEXT.get(top or "", "nothing avoidable") + "; details on the Cache page"))


live()
