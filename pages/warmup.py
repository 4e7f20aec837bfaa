"""A new browser tab's head start: once a page is drawn and the tab is idle, evaluate the
JavaScript of the element kinds other pages draw, so the first click to such a page does not.

Streamlit loads each element kind's code (a chunk of its frontend bundle) the first time a tab
shows one: Plotly's is 4.7 MB and took 0.35 s of evaluation on a fresh tab at load 3, on the
click that first shows a chart. Importing the same chunk URL earlier fills the tab's module
map, which Streamlit's own import then finds."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import streamlit as st

# Element kinds to load ahead (the names of Streamlit's chunks, which carry a content hash
# after the name): Plotly's and the data table's. The Overview and Routing draw their charts as
# SVG, so the first chart page a session opens from them would otherwise evaluate Plotly's
# 4.7 MB on the click (the Inspector's first click: 3.15 s, 534 ms of it the server's, demo at
# load 6.1, busy core); the table's chunk and the Arrow formatting it imports (1.2 MB) were the
# first Routing click's: after 7 s on a fresh tab's Overview, that click took 1.04 s median
# without it and 0.76 s with it (five each in turns, a kept live store, load 1-4). The other
# kinds' chunks are small.
CHUNKS = ("PlotlyChart", "DataFrame")

# Only once the tab has been quiet (no script running, no click or key) for QUIET_MS, one
# chunk per idle period: evaluating Plotly's chunk holds the tab's main thread (0.5–1.5 s at
# load 6–8), and begun at once after a fresh load it slowed the click that came right after
# (the Overview's first click 2.42 s against 0.63 s without, demo at load 7.5).
QUIET_MS = 2000
SCRIPT = """<script>
(() => {
  if (window.mmlensWarm) return;
  window.mmlensWarm = true;
  const index = [...document.scripts].find(s => /\\/static\\/js\\/index\\.[^/]*\\.js$/.test(s.src));
  if (!index) return;
  const base = index.src.slice(0, index.src.lastIndexOf("/") + 1);
  const chunks = CHUNKS_JSON;
  let last = Date.now();
  for (const kind of ["pointerdown", "keydown", "wheel"])
    document.addEventListener(kind, () => { last = Date.now(); },
                              {capture: true, passive: true});
  const idle = f => window.requestIdleCallback ? requestIdleCallback(f, {timeout: 5000})
                                               : setTimeout(f, 300);
  const running = () => document.querySelector("[data-testid='stApp']")
    ?.getAttribute("data-test-script-state") === "running";
  const next = () => {
    if (!chunks.length) return;
    if (running()) last = Date.now();
    if (Date.now() - last < QUIET_MS) { setTimeout(next, 250); return; }
    idle(() => import(base + chunks.shift()).catch(() => {}).finally(next));
  };
  setTimeout(next, 250);
})();
</script>""".replace("QUIET_MS", str(QUIET_MS))


@functools.cache
def chunk_files(js_dir: Path | None = None) -> tuple[str, ...]:
    """The file names of ``CHUNKS`` in the installed Streamlit's frontend (a kind it no
    longer has is left out)."""
    js_dir = js_dir or Path(st.__file__).parent / "static" / "static" / "js"
    found = []
    for name in CHUNKS:
        files = sorted(js_dir.glob(f"{name}.*.js"))
        if files:
            found.append(files[0].name)
    return tuple(found)


def warm_browser() -> None:
    """Put the head start's script at the sidebar's foot (it runs once per tab)."""
    files = chunk_files()
    if files:
        with st.sidebar:
            st.html(SCRIPT.replace("CHUNKS_JSON", json.dumps(list(files))),
                    unsafe_allow_javascript=True)


def warm_server() -> None:
    """Pay, when the server starts, a once-per-process cost a session's first click would:
    the first alert (``st.error`` and its kind) whose text is not ASCII imports Streamlit's
    emoji catalog, whose regex compiles on import (154 ms of CPU in the fleet Overview's
    first run)."""
    import streamlit.emojis  # noqa: F401
