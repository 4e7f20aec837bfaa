"""Targets: the collectors' mmlens.toml — view, edit, validate, save — and what they found."""

import html
import json
import os
from pathlib import Path

import streamlit as st
from mmlens.ui import shared

from mmlens.config import ENV_CONFIG, ConfigError
from mmlens.targets_toml import error_line, validate_toml

st.title("Targets")

with shared.page_guard("Targets"):
    cfg_path = os.environ.get(ENV_CONFIG)
    if cfg_path and Path(cfg_path).is_file():
        original = Path(cfg_path).read_text()
        st.caption(f"Config file: `{Path(cfg_path).name}` (from ${ENV_CONFIG})")
    else:
        original = ('interval_s = 5\n\n[[router]]\nname = "smg"\nkind = "smg"\n'
                    'url = "http://127.0.0.1:30000"\n'
                    'metrics_url = "http://127.0.0.1:29000/metrics"\n')
        st.info(f"No config file (${ENV_CONFIG} unset): edit this example and save it where "
                "`mmlens collect --config` will read it.")
    text = st.text_area("mmlens.toml", original, height=360, key="targets_toml")
    try:
        cfg = validate_toml(text, Path(cfg_path).parent if cfg_path else Path("."))
    except ConfigError as exc:
        line = error_line(text, str(exc))
        where = "" if line is None else (
            f" — line {line}: `{text.splitlines()[line - 1].strip()[:120]}`")
        st.error(f"Not valid: {exc}{where}")
        cfg = None
    if cfg is not None:
        st.success(f"Valid: {len(cfg.routers)} router(s), {len(cfg.workers)} worker(s), "
                   f"Prometheus {'at ' + cfg.prometheus_url if cfg.prometheus_url else 'off'}.")
        if cfg.routers:
            shared.small_table([{"name": x.name, "kind": x.kind, "url": x.url,
                                 "metrics": x.metrics_url or "—",
                                 "api key from": x.api_key_env or "—"} for x in cfg.routers])
        if cfg.workers:
            shared.small_table([{"name": w.name, "engine": w.engine,
                                 "router calls it": w.router_url or "—",
                                 "metrics": w.metrics_url or "—",
                                 "kv events": w.kv_events or "—"} for w in cfg.workers])
    can_save = bool(cfg_path) and cfg is not None and text != original
    why = ("fix the error above first" if cfg is None else
           "no config file to write ($MMLENS_CONFIG unset)" if not cfg_path else
           "nothing changed" if text == original else
           "writes the file; the running collectors apply it within a few seconds")
    if st.button("Save", disabled=not can_save, key="targets_save", help=why) and cfg_path:
        Path(cfg_path).write_text(text)
        st.success("Saved. The collectors apply it within a few seconds (routers, workers); "
                   "the Lab offers new routers as soon as they have. Interval, store limits, "
                   "Prometheus and OTLP apply at the collectors' next start.")

    st.subheader("What the collectors use now")
    r = shared.reader()
    if r is not None:
        targets = r.meta("targets")
        if not targets:
            st.info("No data yet: the collectors have not started.")
        else:
            # Pre-formatted text, not st.json: its viewer is a chunk of JavaScript of its own.
            with st.expander("As JSON"):
                text = html.escape(json.dumps(targets, indent=2))
                st.html(f'<pre style="font-size:0.8rem">{text}</pre>')
