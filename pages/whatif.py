"""What if: the recorded window replayed through models of other routers, modes, block sizes
and cache sizes, side by side with the recording and its baseline replay, in total and per
minute (`mmlens whatif` on the page)."""

import pandas as pd
import streamlit as st
from mmlens.ui import shared

from mmlens.figures.whatif import minute_hit_rates
from mmlens.whatif.blocks import BlockSizeError
from mmlens.whatif.compare import Comparison, compare, recorded_capacity
from mmlens.whatif.scenario import Scenario, ScenarioError, parse, recorded_workers
from mmlens.whatif.table import figure_rows, headers, minute_rows, minute_series

DEFAULT_CAPACITY = 2048
PRESETS = {
    "SMG cache_aware, worker mode": "policy=cache_aware,mode=worker",
    "SMG cache_aware, router mode": "policy=cache_aware,mode=router",
    "Dynamo KV router (exact MM keys)": "policy=dynamo_kv,mode=exact",
    "Dynamo KV router, approximate (no KV events)": "policy=dynamo_kv,mode=approximate",
    "Dynamo KV router, text-prefix fallback": "policy=dynamo_kv,mode=text_prefix",
    "SMG, half the cache": "policy=cache_aware,capacity_blocks=half",
    "SMG round_robin": "policy=round_robin",
    "SMG random": "policy=random",
}

st.title("What if")
st.caption("The requests recorded in the time range, replayed through a model of each "
           "configuration picked below. The baseline replays the recorded configuration; "
           "± after a figure is its distance from what was measured there — the model's own "
           "error.")
path = shared.require_reader()


@shared.records_cache(ttl=30, show_spinner="Replaying the window…", max_entries=8)
def _compare(path: str, window_s: int, specs: tuple[str, ...]) -> Comparison | str:
    reader = shared.reader_for(path)
    span = reader.trace_span()
    if span is None:
        return "No recorded requests yet: send some from the Lab page."
    since = max(span[0], span[1] - window_s)
    workload = reader.workload(since, span[1])
    if not workload:
        return "No recorded requests in the time range."
    capacity = recorded_capacity(reader.samples(since - 3600.0, ["vllm:cache_config_info"])
                                 ) or DEFAULT_CAPACITY
    base = Scenario(workers=max(len(recorded_workers(workload)), 1), capacity_blocks=capacity,
                    block_size=next((r.keys.block_size for r in workload if r.keys), 16))
    try:
        scenarios = [parse(spec.replace("capacity_blocks=half",
                                        f"capacity_blocks={max(capacity // 2, 1)}"), base)
                     for spec in specs]
        return compare(workload, scenarios, capacity_blocks=capacity)
    except (ScenarioError, BlockSizeError) as exc:
        return f"Cannot replay: {exc}"


with shared.page_guard("What if"):
    picked = st.multiselect("Scenarios", list(PRESETS), default=[
        "SMG cache_aware, worker mode", "Dynamo KV router (exact MM keys)",
        "SMG, half the cache"])
    custom = st.text_input("More scenarios (key=value,… ; separate with ;)", value="",
                           help="e.g. policy=cache_aware,balance_abs_threshold=8 ; "
                                "policy=dynamo_kv,router_temperature=0.5,workers=4")
    specs = tuple(PRESETS[p] for p in picked) + tuple(
        s.strip() for s in custom.split(";") if s.strip())
    result = _compare(path, shared.time_window(), specs)
    if isinstance(result, str):
        st.info(result)
    else:
        b = result.baseline
        cols = st.columns(3)
        cols[0].metric("Requests modelled", f"{len(b.run.requests)} / {len(result.workload)}")
        cols[1].metric("Recorded hit rate", "—" if result.measured.hit_rate is None
                       else f"{100 * result.measured.hit_rate:.1f}%")
        err = result.error.get("hit_rate")
        cols[2].metric("Baseline model error", "—" if err is None else f"{100 * err:+.1f} pt")
        head = headers(result)
        figures = pd.DataFrame(figure_rows(result), columns=["figure", *head[1:]])
        st.dataframe(shared.table(figures), hide_index=True, width="stretch")
        st.plotly_chart(minute_hit_rates(minute_series(result)), key="whatif_minutes",
                        width="stretch")
        with st.expander("Per minute"):
            minutes = pd.DataFrame(minute_rows(result), columns=["minute", *head[1:]])
            st.dataframe(shared.table(minutes), hide_index=True, width="stretch")
        st.caption(
            f"Baseline: {b.run.scenario.label}; routed as the recording shows for "
            + ("—" if b.worker_agreement is None else f"{100 * b.worker_agreement:.0f}%")
            + " of requests. Verdicts use the dashboard's words: false_hit = the router "
            "believed the worker held blocks its engine did not; unexplained = a worker held "
            "more of the prompt and the policy did not follow it; fallback = routed on the "
            "text before the images only. Not modelled: timing changes under another "
            "placement, engine queueing, preemption, offload tiers.")
