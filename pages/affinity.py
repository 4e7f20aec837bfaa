"""Affinity: which worker each image identity went to, how sticky it is, where it lives."""

import streamlit as st
from mmlens.ui import shared
from mmlens.ui.blocks import Static

from mmlens.analysis.affinity import image_affinity, sankey_links
from mmlens.analysis.identity_map import identity_links, identity_rows
from mmlens.analysis.views.affinity import image_rows
from mmlens.figures.affinity import affinity_sankey

st.title("Affinity")
path = shared.require_reader()


@st.fragment(run_every=shared.refresh_every())
def live() -> None:
    with shared.page_guard("Affinity"), Static() as block:
        names = shared.worker_names(path)
        traces = shared.recent_traces(path, shared.AHEAD_TRACES)
        affinities = image_affinity(traces)
        if not affinities:
            st.info("No image requests with a known worker yet: send some from the Lab page.")
        else:
            sizes = {a.identity: a.size for a in affinities}
            block.add(affinity_sankey(sankey_links(affinities), sizes, names))
            block.heading("Per image (router-side identity)")
            block.table(image_rows(affinities, names))
        links = identity_links(shared.recent_kv_events(path, 500), traces)
        block.heading("Image identity: router side ↔ engine side")
        if links:
            block.table(identity_rows(links, names))
            block.caption("Learned from the image blocks a worker stored while it served a "
                          "one-image request. In router mode the engine keys an image by the "
                          "identity the router sends; in worker mode by its own, so the same "
                          "bytes get two engine identifiers and their cache entries do not "
                          "meet.")
        else:
            block.caption("No mapping yet: it is learned from one-image requests whose worker "
                          "stored new image blocks (KV events) while serving them.")
        announced, several, per_worker = shared.residency(path)
        block.heading("Residency (engine-side identifiers, from KV events)")
        if not announced:
            block.flush()
            st.info("No KV-event state yet: no worker has announced blocks.")
            return
        if several:
            block.flush()
            st.warning(f"{len(several)} image(s) resident on more than one worker: each copy "
                       "was prefilled again.")
            block.table(several)
        else:
            block.caption("No image is resident on more than one worker.")
        block.table(per_worker)

live()
