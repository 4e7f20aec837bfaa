"""Lab: send test image requests through a router and see what each one got; send the same
request through a router-mode and a worker-mode router and compare what the engines counted."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import streamlit as st
from mmlens.ui import shared

from mmlens.analysis.lab_experiment import judge_experiment, same_size_warning, seed_notes
from mmlens.analysis.lab_plan import (
    SEQUENCES,
    ImageSpec,
    StepResult,
    batches,
    plan_steps,
    result_rows,
    run_images,
    summary_line,
)
from mmlens.analysis.scenarios import NAMES as SCENARIOS
from mmlens.analysis.views.lab import (
    check_inputs,
    compare_modes,
    judged,
    models_of,
    modes_of_samples,
    routers,
    step_result,
)
from mmlens.analysis.views.routing import MODE_SERIES
from mmlens.config import RouterTarget
from mmlens.errors import LayoutError
from mmlens.layout.families import get_family
from mmlens.layout.modeldir import resolve_model
from mmlens.layout.sent import ImagePart
from mmlens.layout.synthetic_images import synthetic_png

if TYPE_CHECKING:
    from mmlens.collectors.sender import Sender

st.title("Lab")
path = shared.require_reader()
MODES_WINDOW_S = 300.0  # the routers' metrics window (``StoreReader.router_metrics``)
SEED_TOKENS = 32  # requests sent together stay in flight long enough to see each other


@st.cache_resource(show_spinner=False)
def sender(db: str) -> Sender:
    # imported on the first send, not the first visit: the sender and its HTTP client
    # (httpx and 120 modules) were most of the Lab's first script (134 of 170 ms, bench store)
    from mmlens.collectors.sender import Sender

    return Sender(db)


@st.cache_data(show_spinner=False, max_entries=32)
def layout_problem(name: str) -> str | None:
    """Why ``name`` gives no expected layout, or None when it resolves."""
    try:
        resolve_model(name)
    except (ValueError, LayoutError, OSError) as exc:
        return (f"unknown layout model {name!r}: {exc} — give a family (qwen3-vl, kimi-k3, "
                "glm-5.3-flash, …) or a model directory")
    return None


@st.cache_data(show_spinner=False, max_entries=64)
def _png(kind: str, width: int, height: int, seed: int, rgb: tuple[int, int, int]) -> bytes:
    return synthetic_png(kind, width, height, seed=seed, rgb=rgb)


def image_bytes(spec: ImageSpec) -> bytes:
    return _png(spec.kind, spec.width, spec.height, spec.seed, spec.rgb)


def send_run(targets: list[dict], steps: list, model: str, modes: dict[str, str], **kw: object,
             ) -> list[StepResult]:
    results: list[StepResult] = []
    bar = st.progress(0.0, text="sending…")
    total, done = len(steps) * len(targets), 0
    names = shared.worker_names(path)
    for tgt in targets:
        rt = RouterTarget(tgt["name"], tgt["kind"], tgt["url"], api_key_env=tgt.get("api_key_env"))
        for batch in batches(steps):
            args = {"router_kind": rt.kind, "api_key": rt.api_key(), **kw}
            if len(batch) > 1:
                traces = sender(path).send_together(
                    rt.url, model, [(s.text, s.images) for s in batch],
                    max_tokens=SEED_TOKENS, **args)
            else:
                traces = [sender(path).send(rt.url, model, batch[0].text, batch[0].images,
                                            **args)]
            results += [step_result(s, tgt["name"], t, names, modes.get(tgt["name"]))
                        for s, t in zip(batch, traces, strict=True)]
            done += len(batch)
            bar.progress(done / total, text=f"{batch[-1].label} → {tgt['name']}")
    bar.empty()
    return results


@st.fragment(run_every=shared.refresh_every())
def live_results() -> None:
    """The last run's results, re-read until the collector has stored every verdict."""
    with shared.page_guard("Lab"):
        show_results(st.session_state.get("lab_results") or [])


def show_results(results: list[StepResult]) -> None:
    from mmlens.figures.lab import steps_figure

    run = st.session_state.get("lab_run") or {}
    if run:
        st.caption(f"Run seed {run['seed']}: {run['images'] or 'no generated images'}"
                   + ("" if run["pinned"] else " — pin the seed to send these images again"))
    # The verdicts are the collector's, stored once each request has settled: pending until
    # then (rerun to read them).
    results = judged(results, shared.verdicts_by_id(path, tuple(r.request for r in results)),
                     shared.worker_names(path))
    if any(r.verdict == "pending" for r in results):
        st.caption("Verdicts show as pending until the collector has judged the requests "
                   "(about 12 s after they ended, once their KV events are in).")
    experiment = judge_experiment(run.get("sequence", ""), results,
                                  same_size=bool(run.get("same_size")),
                                  content_blind=bool(run.get("content_blind")))
    if experiment.outcome != "inconclusive":
        box = st.success if experiment.outcome == "pass" else st.error
        box(f"**{experiment.outcome.upper()}** — {experiment.reason}")
        st.caption(f"This sequence expects: {experiment.expects}.")
    seeds = seed_notes(results)
    rows = result_rows(results, seeds)
    st.markdown(summary_line(results, seeds))
    st.plotly_chart(steps_figure(rows), key="lab_steps", width="stretch")
    shared.request_table(rows, "lab_results_table", column_config={
        "why": st.column_config.TextColumn("why", width="large"),
        "TTFT ms": st.column_config.NumberColumn("TTFT", format="%.1f ms",
                                                 help="time to the first streamed token"),
        "TTFT change": st.column_config.TextColumn(
            "TTFT change", width="medium",
            help="against the first send of the same images to that router")})
    comparisons = compare_modes(results)
    for c in comparisons:
        st.subheader(f"Router mode vs worker mode: {c.step}")
        st.dataframe(shared.table(c.rows), hide_index=True, width="stretch")
        for note in c.notes:
            st.info(note)
    if not comparisons and len(routers(shared.meta(path, "targets"))) > 1:
        st.caption("Turn on *Compare across routers* to send the same request through every "
                   "router (the demo's runs in router mode and in worker mode) and compare the "
                   "engines' prompt token counts.")


with shared.page_guard("Lab"):
    known = routers(shared.meta(path, "targets"))
    if not known:
        st.info("No router configured yet: add one on the Targets page (or start "
                "`mmlens dashboard --demo`).")
        st.stop()
    modes = modes_of_samples(shared.samples(path, (MODE_SERIES,), MODES_WINDOW_S))
    c1, c2 = st.columns(2)
    urls = {x["name"]: x["url"] for x in known}
    name = c1.selectbox(
        "Router", list(urls), key="lab_router",
        format_func=lambda n: f"{n} · {urls[n]}" + (f" · {modes[n]} mode" if n in modes else ""))
    router = next(x for x in known if x["name"] == name)
    models = models_of(shared.meta(path, "router_state"), name)
    if models:
        model = c2.selectbox("Model", models, key="lab_model")
    else:
        model = c2.text_input("Model", key="lab_model_text",
                              help="the router listed no models (is it down?)")
        st.warning(f"Router {name} listed no models: it is down or unreachable (see the "
                   "Overview), and requests to it fail until it is back. Pick another router "
                   "or type a model to try anyway.")
    try:
        guess = get_family(model).name if model else ""
    except ValueError:
        guess = ""
    layout_model = st.text_input("Layout model (family or model directory, for expected "
                                 "layouts)", guess or "qwen3-vl", key="lab_layout_model")
    layout_error = st.empty()
    text = st.text_area("Text", "Describe this image in detail: the objects, their colours, "
                        "any text, and the setting.", key="lab_text")
    st.markdown("**Images** — each image gets its own seed and tint")
    g1, g2, g3, g4, g5 = st.columns([1, 2, 1, 1, 1])
    kind = g1.selectbox("Synthetic", ["gradient", "noise", "solid", "none"], key="lab_kind")
    sizes = g2.text_input("Sizes (WxH, comma-separated; image i takes the i-th)",
                          "480x360, 640x480", key="lab_size")
    count = int(g3.number_input("How many", 0, 8, 2, key="lab_count"))
    pinned = g4.toggle("Pin seed", key="lab_pin", help="off: fresh images every run")
    seed = int(g5.number_input("Seed", 0, 999_999, 1, key="lab_seed", disabled=not pinned))
    sizes_error = st.empty()
    uploaded = shared.uploaded_images("lab_uploads")
    url = st.text_input("Image URL (passed through to the router)", key="lab_url")
    url_error = st.empty()

    s1, s2, s3 = st.columns([2, 1, 1])
    choices = list(SEQUENCES) + [f"scenario:{n}" for n in SCENARIOS]
    sequence = s1.selectbox(
        "Run", choices, key="lab_sequence", index=choices.index("abab"),
        format_func=lambda k: (f"scenario {k.split(':', 1)[1]} (mmlens check; its own images)"
                               if k.startswith("scenario:") else SEQUENCES[k]))
    stream = s2.toggle("Stream", True, key="lab_stream", help="streamed requests measure TTFT")
    compare = s3.toggle("Compare across routers", key="lab_compare",
                        help="send the same request to every configured router, e.g. one in "
                             "router mode and one in worker mode")
    sequence_error = st.empty()
    keep_text = st.toggle(
        "Store the prompt text", key="lab_keep_text",
        help="off: the store keeps counts, spans, per-block content keys and image "
             "identities, never the text; on: the inspector can also rebuild every view's "
             "token ids and hashes")
    inputs = check_inputs(kind, sizes, count, url, sequence, len(uploaded))
    problem = layout_problem(layout_model.strip()) if layout_model.strip() else None
    if problem:
        inputs.errors["layout"] = problem
    for key, box in (("layout", layout_error), ("sizes", sizes_error), ("url", url_error),
                     ("sequence", sequence_error)):
        if key in inputs.errors:
            box.error(inputs.errors[key])
    blind_warning = same_size_warning(sequence, inputs.sizes, count if kind != "none" else 0,
                                      router["kind"], modes.get(name))
    if blind_warning:
        st.warning(blind_warning)
    go = st.button("Send", type="primary", key="lab_send", disabled=bool(inputs.errors))

    if go and sequence.startswith("scenario:"):
        bar = st.progress(0.0, text="starting…")

        def progress(what: str, done: int, total: int) -> None:
            bar.progress(min(1.0, done / max(total, 1)), text=what)

        worker_mode = [x["url"] for x in known if modes.get(x["name"]) == "worker"
                       and x["name"] != name]
        others = worker_mode or [x["url"] for x in known if x["name"] != name]
        result = sender(path).run_scenario(
            router["url"], model or "default", layout_model, sequence.split(":", 1)[1],
            router_kind=router["kind"], worker_mode_router_url=others[0] if others else None,
            progress=progress, media_origin=router.get("media_origin"))
        bar.empty()
        st.session_state["lab_scenario"] = result.as_json()
        shared.forget_store_reads()
    elif go:
        run_seed = seed if pinned else random.randrange(1, 1_000_000)
        specs = run_images(kind, inputs.sizes, count, run_seed)
        parts = [ImagePart(image_bytes(s)) for s in specs]
        parts += [ImagePart(data, mime=f"image/{info.format.lower()}") for data, info in uploaded]
        labels = [s.name for s in specs] + [f"upload {i + 1}" for i in range(len(uploaded))]
        if inputs.url:
            parts.append(ImagePart(url=inputs.url))
            labels.append("URL")
        st.session_state["lab_run"] = {
            "seed": run_seed, "pinned": pinned, "sequence": sequence,
            "same_size": blind_warning is not None, "content_blind": blind_warning is not None,
            "images": ", ".join(f"{s.name} {s.width}x{s.height}" for s in specs)}
        steps = plan_steps(sequence, parts, text, labels)
        st.session_state["lab_results"] = send_run(
            known if compare else [router], steps, model or "default", modes,
            layout_model=layout_model, stream=stream, keep_text=keep_text)
        shared.forget_store_reads()

    scenario = st.session_state.get("lab_scenario")
    if scenario:
        st.subheader(f"Scenario {scenario['name']}")
        box = {"pass": st.success, "fail": st.error}.get(scenario["verdict"], st.warning)
        box(f"**{scenario['verdict']}** — {scenario['summary']}")
        if scenario["requests"]:
            st.dataframe(shared.table(scenario["requests"]), hide_index=True, width="stretch")
        with st.expander("Evidence"):
            st.json(scenario["evidence"])

    results = st.session_state.get("lab_results") or []
    if results:
        st.subheader("Results")
        live_results()
    else:
        st.caption("Compose a request and press Send: per step the worker, the tokens served "
                   "from cache and those computed, the router's prediction, the verdict and "
                   "the TTFT appear here.")
