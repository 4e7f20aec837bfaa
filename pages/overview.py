"""Overview: targets and their health, headline numbers, alerts that name their cause."""

import time

import pandas as pd
import streamlit as st
from mmlens.ui import shared

from mmlens.analysis import overview
from mmlens.figures.cache import worker_hit_rate_bars

st.title("Overview")
r = shared.reader()
if r is None:
    st.stop()
path = r.path


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.0%}"


@st.fragment(run_every=shared.REFRESH_S)
def live() -> None:
    with shared.page_guard("Overview"):
        snap = shared.snapshot(path)
        traces = snap.traces
        now = time.time()
        if not snap.health and not traces:
            st.info("No data yet: the collectors have not reported. Targets appear after "
                    "their first scrape (a few seconds).")
            return
        head = overview.headline(snap, traces)
        c1, c2, c3, c4 = st.columns(4)
        c1.metric("Engine hit rate (token-weighted)", _pct(head.engine_hit_rate),
                  help="Σ prefix-cache hit tokens / Σ queried tokens over the last 5 min, "
                       "from the workers' counters (never a per-batch gauge)")
        c2.metric("Router-predicted hit rate", _pct(head.predicted_hit_rate),
                  help=f"predicted cached tokens / prompt tokens over "
                       f"{head.predicted_requests} recent traced requests")
        c3.metric("Image requests in router mode", _pct(head.router_mode_share),
                  help=f"smg_mm_processing_total, {head.image_requests:.0f} requests")
        c4.metric("Image requests in worker mode", _pct(head.worker_mode_share))

        st.subheader("Alerts")
        workers_seen = shared.worker_view(path)
        found = overview.alerts(snap, traces, now) + workers_seen.alerts
        if not found:
            st.success("No alerts: KV events flow, predictions match what the engines found, "
                       "block sizes agree, workers are healthy.")
        for a in found:
            box = {"error": st.error, "warning": st.warning}.get(a.severity, st.info)
            box(f"**{a.cause}** — {a.message}")

        st.subheader("Targets")
        if snap.latest_sample_ts is None:
            st.warning("No metrics scraped yet: the router or the workers may be down.")
        prom = (snap.targets or {}).get("prometheus")
        st.caption(f"Prometheus: {prom}" if prom else
                   "Prometheus: not configured (metrics are scraped directly from /metrics).")
        rows = overview.target_rows(snap, now)
        if rows:
            st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
        shards = overview.shard_rows(snap, now)
        if shards:
            st.markdown("**Collector shards** (`mmlens collect --shard I/N`)")
            st.dataframe(pd.DataFrame(shards), hide_index=True, width="stretch")
        workers = [{"router": s.get("router"), "worker": w["url"], "healthy": w["healthy"],
                    "status": w["status"], "load": w["load"],
                    "kv_block_size": w["kv_block_size"],
                    "mm_processor": w.get("mm_processor") or "—"}
                   for s in snap.router_state or [] for w in s.get("workers") or []]
        down = [s["router"] for s in snap.router_state or [] if not s.get("workers")
                and s.get("kind") == "smg"]
        for name in down:
            st.error(f"Router {name} is down or unreachable: its /workers did not answer.")
        if workers:
            st.markdown("**Workers as the router lists them**")
            st.dataframe(pd.DataFrame(workers), hide_index=True, width="stretch")
        if workers_seen.rows:
            st.markdown("**Workers: liveness (from the routers' own series) and where their KV "
                        "events come from**")
            st.dataframe(pd.DataFrame(workers_seen.rows), hide_index=True, width="stretch")
        if snap.metrics.hit_rates:
            st.plotly_chart(worker_hit_rate_bars(snap.metrics.hit_rates), key="overview_hit_rates",
                            width="stretch")


live()
