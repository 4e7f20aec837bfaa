"""Request inspector: one request's token layout — router and worker views, the block grid,
hashes on hover, counts side by side, and where router and worker part ways."""

from typing import Any

import streamlit as st
from mmlens.ui import shared

from mmlens.analysis.judgement.shown import headline
from mmlens.analysis.observed_fields import field_rows
from mmlens.analysis.request_view import RequestView, from_layout, from_trace, rebuild_parts
from mmlens.analysis.views.cause import cause_sentence, default_partner, diff_rows
from mmlens.analysis.views.common import markdown_table, named_text, router_names
from mmlens.analysis.views.inspector import (
    cached_text,
    evidence_rows,
    explanation_text,
    image_rows,
    prediction_rows,
    request_label,
    timing_caption,
)
from mmlens.errors import LayoutError
from mmlens.figures.layout_svg import layout_svg_html
from mmlens.figures.metric_row import Metric
from mmlens.figures.router_views import router_panel
from mmlens.figures.token_layout import layout_figure
from mmlens.layout.composition import ImageInput, Layout
from mmlens.layout.families import FAMILIES
from mmlens.layout.hashing import dynamo_mm_hash_url, smg_identifier
from mmlens.layout.imageinfo import parse_size
from mmlens.layout.modeldir import Model, resolve_model
from mmlens.layout.synthetic_images import synthetic_png

st.title("Request inspector")


@st.cache_resource(show_spinner="Loading the model's tokenizer…", max_entries=16)
def model_for(name: str) -> Model:
    return resolve_model(name)


@st.cache_data(show_spinner=False, max_entries=64)
def rebuilt_layout(model: str, parts_key: tuple[Any, ...], block_size: int) -> Layout:
    parts = [ImageInput(w, h) if kind == "image" else w for kind, w, h in parts_key]
    return model_for(model).layout(parts, block_size=block_size)


def show(rv: RequestView, title: str) -> None:
    c = rv.counts
    observed = c.get("engine_prompt_tokens")
    delta = (observed - c["engine_expected"]) if observed is not None and c.get(
        "engine_expected") is not None else None
    shared.metrics(
        Metric("Anchor view", str(c.get("anchor_view") or "—"),
               "rendered prompt, one anchor token per image"),
        Metric("Router view", str(c.get("router_view") or "—"),
               "router-mode expansion: what a router hashes into blocks"),
        Metric("Worker view", str(c.get("worker_view") or "—"),
               "what the router forwards in worker mode (anchors unexpanded)"),
        Metric("Engine expected", str(c.get("engine_expected") or "—"),
               "the engine's own expansion: its usage.prompt_tokens"),
        Metric("Engine prompt_tokens", "—" if observed is None else str(observed),
               delta=f"{delta:+d} vs expected" if delta else None, delta_is="bad"))
    if rv.rows:
        # SVG first: a tab's first Plotly chart waits for Plotly's code; zooming is a toggle
        if st.toggle("Zoomable chart", key="layout_zoom",
                     help="the same layout in Plotly: zoom into long prompts"):
            st.plotly_chart(layout_figure(rv, title), key="layout_figure", width="stretch")
        else:
            shared.chart(layout_svg_html(rv, title))
    for d in rv.divergences:
        st.warning(f"**First divergent block {d.block}** ({d.reason}): {d.detail}")
    if rv.rows and not rv.divergences:
        st.success("Router and engine layouts agree block for block.")
    for note in rv.notes:
        st.caption(note)


def per_router(model: str, parts: list[Any], block_size: int) -> None:
    """The engine's, SMG's and Dynamo's own views of the request, and how each differs."""
    st.subheader("Each router's view")
    try:
        panel = router_panel(model_for(model), parts, block_size)
    except LayoutError as exc:
        st.caption(f"per-router views not built: {exc}")
        return
    shared.small_table(panel.parties)
    for d in panel.differences:
        st.warning(f"**{d['router']} — {d['cause']}**: {d['detail']}")
    for note in panel.notes:
        st.caption(note)


def captured(path: str) -> None:
    names = shared.worker_names(path)
    traces = shared.recent_traces(path)
    wanted = st.query_params.get("request")
    by_id = {t.request_id: t for t in traces}
    if wanted and wanted not in by_id:
        t = shared.trace_by_id(path, wanted)
        if t is None:
            st.warning(f"Request {wanted} is not in the store (pruned, or from another store).")
        else:
            by_id = {wanted: t, **by_id}
    if not by_id:
        st.info("No captured requests yet. Send some from the Lab page, or compose one here.")
        return
    ids = list(by_id)
    index = ids.index(wanted) if wanted in ids else 0
    rid = st.selectbox("Request", ids, index=index, key="inspector_request",
                       format_func=lambda i: request_label(by_id[i], names))
    if rid != wanted:
        st.query_params["request"] = rid
    trace = by_id[rid]
    verdict = shared.verdict(path, rid)
    if verdict is None:
        st.caption(headline(None))
    else:
        box = st.success if verdict.category == "hit" else st.info
        box(f"**{cause_sentence(verdict, names)}**", icon=":material/lightbulb:")
    side_by_side(path, trace, by_id, names)
    layout = None
    rebuild = rebuild_parts(trace)
    if rebuild is not None:
        model, parts, bs = rebuild
        key = tuple(("image", p.width, p.height) if isinstance(p, ImageInput) else ("text", p, 0)
                    for p in parts)
        try:
            layout = rebuilt_layout(model, key, bs)
        except ValueError as exc:
            st.caption(f"layout not rebuilt: {exc}")
    rv = from_trace(trace, layout)
    show(rv, f"{rid} → {shared.worker_label(trace.worker, names)}")
    if rebuild is not None:
        per_router(rebuild[0], rebuild[1], rebuild[2])
    if verdict is not None:  # the stored verdict, with the evidence it used
        expl = verdict.as_json()
        st.subheader("Why this many cached tokens")
        box = st.success if expl["category"] == "hit" else st.warning
        box(named_text(explanation_text(expl), names))
        if expl["evidence"]:
            with st.expander("Evidence"):
                st.markdown(markdown_table(evidence_rows(
                    {**expl["evidence"], "sources": expl["sources"],
                     "unknown": expl["unknown"]})))
    if trace.origin == "observed":
        st.subheader("Where each field came from")
        shared.small_table(field_rows(trace))
        st.caption("An observed request (not sent by mmlens): " + ", ".join(
            trace.sources) + ". \"unknown\": no source told it (e.g. the "
            "realized hit without the tap, a worker span or KV events).")
    st.subheader("Routing")
    shared.metrics(
        Metric("Worker", shared.worker_label(trace.worker, names)),
        Metric("Router predicted (tokens)", "—" if rv.predicted_tokens is None
               else str(rv.predicted_tokens)),
        Metric("Engine cached (tokens)", str(cached_text(trace))))
    if trace.error:
        st.error(f"The router answered {trace.status} {trace.error_code}: {trace.error}")
    preds = prediction_rows(trace)
    if preds:
        shared.routing_detail(trace, names)
        with st.expander("Everything the router said, by source"):
            shared.small_table(preds)
    else:
        st.caption("The router said nothing about this decision (no cache-trace header, no "
                   "matching log line).")
    images = image_rows(trace)
    if images:
        shared.small_table(images)
    st.caption(timing_caption(trace))


def side_by_side(path: str, trace: Any, by_id: dict[str, Any], names: dict[str, str]) -> None:
    """This request next to another (by default the nearest with the same images: A vs A
    again, or the same request through the router-mode and the worker-mode router)."""
    partner = default_partner(trace, list(by_id.values()))
    if partner is None:
        return
    with st.expander(f"Side by side with {partner.request_id} (what differs)"):
        ids = [i for i in by_id if i != trace.request_id]
        other = st.selectbox("Compare with", ids, index=ids.index(partner.request_id),
                             key="inspector_compare",
                             format_func=lambda i: request_label(by_id[i], names))
        b = by_id[other]
        rows = diff_rows(trace, shared.verdict(path, trace.request_id), b,
                         shared.verdict(path, b.request_id), names,
                         router_names(shared.meta(path, "targets")))
        st.markdown(markdown_table(rows))
        st.caption("◆ marks what differs. Same images with other workers or verdicts is "
                   "affinity at work (or not); same request, other processing mode shows what "
                   "each mode routes on.")


def compose() -> None:
    names = [f.name for f in FAMILIES]
    c1, c2, c3 = st.columns([2, 1, 1])
    model = c1.selectbox("Model family", names, index=names.index("qwen3-vl"),
                         key="compose_model")
    block_size = int(c2.number_input("Block size", 1, 1024, 16, key="compose_block"))
    drift = int(c3.number_input("Engine count drift", -64, 64, 0, key="compose_drift",
                                help="make the engine expand each image by N more tokens"))
    text = st.text_area("Text", "Describe this image in detail please.", key="compose_text")
    sizes = st.text_input("Generated images (WxH, comma-separated)", "640x480",
                          key="compose_sizes")
    images: list[ImageInput] = []
    identities: list[str] = []
    for data, info in shared.uploaded_images("compose_uploads"):
        images.append(ImageInput(info.width, info.height, data=data, format=info.format))
        identities.append(smg_identifier(data))
    for i, item in enumerate(s for s in sizes.split(",") if s.strip()):
        try:
            w, h = parse_size(item)
        except ValueError as exc:
            st.error(str(exc))
            continue
        data = synthetic_png("solid", w, h, rgb=(40 * i % 255, 120, 200))
        images.append(ImageInput(w, h, data=data, format="PNG"))
        identities.append(smg_identifier(data))
    u1, u2 = st.columns([3, 1])
    url = u1.text_input("Image by URL (not fetched: give its size)", key="compose_url")
    url_size = u2.text_input("URL image size", "640x480", key="compose_url_size")
    if url.strip():
        try:
            w, h = parse_size(url_size)
            images.append(ImageInput(w, h, url=url.strip()))
            identities.append(f"{dynamo_mm_hash_url(url.strip()):016x}")
        except ValueError as exc:
            st.error(str(exc))
    try:
        layout = model_for(model).layout([*images, text], block_size=block_size,
                                         engine_count_drift=drift)
        show(from_layout(layout, identities), f"{model}: {len(images)} image(s)")
    except LayoutError as exc:
        st.warning(f"{exc}: each router's outcome is below.")
    per_router(model, [*images, text], block_size)


r = shared.reader()
with shared.page_guard("Request inspector"):
    mode = st.radio("Source", ["Captured request", "Compose"], horizontal=True,
                    key="inspector_mode",
                    index=0 if r is not None or st.query_params.get("request") else 1)
    if mode == "Compose":
        compose()
    elif r is not None:
        captured(r.path)
