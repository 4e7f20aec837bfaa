"""Lab: send test image requests through a router and see what each one got; compare the
router-mode and worker-mode prompt token counts of the same request."""

import pandas as pd
import streamlit as st
from mmlens.collectors.sender import Sender
from mmlens.ui import shared

from mmlens.analysis.lab_plan import SEQUENCES, comparison_rows, plan_steps, result_row
from mmlens.analysis.scenarios import NAMES as SCENARIOS
from mmlens.analysis.views.lab import models_of, routers, tint
from mmlens.config import RouterTarget
from mmlens.layout.families import get_family
from mmlens.layout.imageinfo import parse_size
from mmlens.layout.sent import ImagePart
from mmlens.layout.synthetic_images import synthetic_png

st.title("Lab")
path = shared.require_reader()


@st.cache_resource(show_spinner=False)
def sender(db: str) -> Sender:
    return Sender(db)


with shared.page_guard("Lab"):
    known = routers(shared.meta(path, "targets"))
    if not known:
        st.info("No router configured yet: add one on the Targets page (or start "
                "`mmlens dashboard --demo`).")
        st.stop()
    c1, c2 = st.columns(2)
    urls = {x["name"]: x["url"] for x in known}
    name = c1.selectbox("Router", list(urls), key="lab_router",
                        format_func=lambda n: f"{n} · {urls[n]}")
    router = next(x for x in known if x["name"] == name)
    models = models_of(shared.meta(path, "router_state"), name)
    if models:
        model = c2.selectbox("Model", models, key="lab_model")
    else:
        model = c2.text_input("Model", key="lab_model_text",
                              help="the router listed no models (is it down?)")
    try:
        layout_model = get_family(model).name if model else ""
    except ValueError:
        layout_model = ""
    layout_model = st.text_input("Layout model (family or model directory, for expected "
                                 "layouts)", layout_model or "qwen3-vl", key="lab_layout_model")

    text = st.text_area("Text", "Describe this image in detail please.", key="lab_text")
    st.markdown("**Images**")
    g1, g2, g3, g4 = st.columns(4)
    kind = g1.selectbox("Synthetic", ["solid", "noise", "gradient", "none"], key="lab_kind")
    size = g2.text_input("Size (WxH)", "640x480", key="lab_size")
    count = int(g3.number_input("How many", 0, 8, 1, key="lab_count"))
    seed = int(g4.number_input("Seed / tint", 0, 1000, 0, key="lab_seed"))
    uploaded = shared.uploaded_images("lab_uploads")
    url = st.text_input("Image URL (passed through to the router)", key="lab_url")

    parts: list[ImagePart] = []
    parts.extend(ImagePart(data, mime=f"image/{info.format.lower()}")
                 for data, info in uploaded)
    if kind != "none" and count:
        w, h = parse_size(size)
        parts += [ImagePart(synthetic_png(kind, w, h, seed=seed + i, rgb=tint(seed)))
                  for i in range(count)]
    if url.strip():
        parts.append(ImagePart(url=url.strip()))

    s1, s2, s3 = st.columns([2, 1, 1])
    choices = list(SEQUENCES) + [f"scenario:{n}" for n in SCENARIOS]
    sequence = s1.selectbox(
        "Run", choices, key="lab_sequence",
        format_func=lambda k: (f"scenario {k.split(':', 1)[1]} (mmlens check; its own images)"
                               if k.startswith("scenario:") else SEQUENCES[k]))
    stream = s2.toggle("Stream", key="lab_stream")
    compare = s3.toggle("Compare across routers", key="lab_compare",
                        help="send the same request to every configured router, e.g. one in "
                             "router mode and one in worker mode")
    keep_text = st.toggle(
        "Store the prompt text", key="lab_keep_text",
        help="off: the store keeps counts, spans, per-block content keys and image "
             "identities, never the text; on: the inspector can also rebuild every view's "
             "token ids and hashes")
    go = st.button("Send", type="primary", key="lab_send")

    if go and sequence.startswith("scenario:"):
        bar = st.progress(0.0, text="starting…")

        def progress(what: str, done: int, total: int) -> None:
            bar.progress(min(1.0, done / max(total, 1)), text=what)

        others = [x["url"] for x in known if x["name"] != name]
        result = sender(path).run_scenario(
            router["url"], model or "default", layout_model, sequence.split(":", 1)[1],
            router_kind=router["kind"], worker_mode_router_url=others[0] if others else None,
            progress=progress)
        bar.empty()
        st.session_state["lab_scenario"] = result.as_json()
        shared.recent_traces.clear()
        shared.snapshot.clear()
    elif go:
        steps = plan_steps(sequence, parts, text)
        targets = known if compare else [router]
        results = []
        bar = st.progress(0.0, text="sending…")
        total = len(steps) * len(targets)
        done = 0
        for tgt in targets:
            rt = RouterTarget(tgt["name"], tgt["kind"], tgt["url"],
                              api_key_env=tgt.get("api_key_env"))
            for label, step_text, step_parts in steps:
                trace = sender(path).send(
                    rt.url, model or "default", step_text, step_parts, router_kind=rt.kind,
                    layout_model=layout_model, stream=stream, api_key=rt.api_key(),
                    keep_text=keep_text)
                results.append(result_row(label, tgt["name"], trace))
                done += 1
                bar.progress(done / total, text=f"{label} → {tgt['name']}")
        bar.empty()
        st.session_state["lab_results"] = results
        shared.recent_traces.clear()
        shared.snapshot.clear()

    scenario = st.session_state.get("lab_scenario")
    if scenario:
        st.subheader(f"Scenario {scenario['name']}")
        box = {"pass": st.success, "fail": st.error}.get(scenario["verdict"], st.warning)
        box(f"**{scenario['verdict']}** — {scenario['summary']}")
        if scenario["requests"]:
            st.dataframe(pd.DataFrame(scenario["requests"]), hide_index=True, width="stretch")
        with st.expander("Evidence"):
            st.json(scenario["evidence"])

    results = st.session_state.get("lab_results") or []
    if results:
        st.subheader("Results")
        df = pd.DataFrame(results)
        df["inspect"] = [shared.inspector_link(rid) for rid in df["request"]]
        st.dataframe(df, hide_index=True, width="stretch", column_config={
            "inspect": st.column_config.LinkColumn("inspect", display_text="open")})
        st.subheader("Router mode vs worker mode: prompt tokens")
        st.dataframe(pd.DataFrame(comparison_rows(results)), hide_index=True, width="stretch")
        st.caption("Router mode: the router expands each image and routes on the router view. "
                   "Worker mode: it forwards one anchor per image and the worker expands with "
                   "its own processor; the engine's prompt_tokens should equal the expected "
                   "count in both.")
    else:
        st.caption("Compose a request and press Send: each step's worker, prompt and cached "
                   "tokens, the router's prediction and TTFT appear here.")
