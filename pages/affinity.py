"""Affinity: which worker each image identity went to, how sticky it is, where it lives."""

import time

import pandas as pd
import streamlit as st
from mmlens.ui import shared

from mmlens.analysis.affinity import image_affinity, multi_resident, sankey_links, worker_image_sets
from mmlens.figures.affinity import affinity_sankey

st.title("Affinity")
r = shared.reader()
if r is None:
    st.stop()
path = r.path


def _clock(ts: float | None) -> str:
    return "—" if ts is None else time.strftime("%H:%M:%S", time.gmtime(ts))


@st.fragment(run_every=shared.REFRESH_S)
def live() -> None:
    with shared.page_guard("Affinity"):
        traces = shared.recent_traces(path, 1000)
        affinities = image_affinity(traces)
        if not affinities:
            st.info("No image requests with a known worker yet: send some from the Lab page.")
        else:
            sizes = {a.identity: a.size for a in affinities}
            st.plotly_chart(affinity_sankey(sankey_links(affinities), sizes),
                            key="affinity_sankey", width="stretch")
            st.subheader("Per image (router-side identity)")
            st.dataframe(pd.DataFrame([{
                "image": a.identity[:16], "size": a.size, "requests": a.requests,
                "workers seen": len(a.workers), "stuck ratio": round(a.stuck_ratio, 2),
                "main worker": shared.short_worker(a.workers.most_common(1)[0][0]),
                "first seen": _clock(a.first_seen), "last seen": _clock(a.last_seen)}
                for a in affinities]), hide_index=True, width="stretch")
        state = shared.kv_state(path)
        st.subheader("Residency (engine-side identifiers, from KV events)")
        if not state:
            st.info("No KV-event state yet: no worker has announced blocks.")
            return
        several = multi_resident(state)
        if several:
            st.warning(f"{len(several)} image(s) resident on more than one worker: each copy "
                       "was prefilled again.")
            st.dataframe(pd.DataFrame([{"image": k[:16], "workers": ", ".join(v)}
                                       for k, v in several.items()]),
                         hide_index=True, width="stretch")
        else:
            st.caption("No image is resident on more than one worker.")
        sets = worker_image_sets(state)
        st.dataframe(pd.DataFrame([{"worker": w, "images": len(imgs),
                                    "image blocks": sum(imgs.values()),
                                    "identifiers": ", ".join(k[:8] for k in imgs)}
                                   for w, imgs in sets.items()]),
                     hide_index=True, width="stretch")


live()
