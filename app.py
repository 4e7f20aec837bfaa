"""Streamlit entry point: `streamlit run app.py` (or `mmlens dashboard`)."""

import streamlit as st
from mmlens.ui import shared
from mmlens.ui.warmup import warm_browser

st.set_page_config(page_title="mmlens", page_icon=":material/search:", layout="wide")


def page(path: str, title: str, icon: str, url: str, default: bool = False,
         hidden: bool = False) -> st.Page:
    return st.Page(path, title=title, icon=f":material/{icon}:", url_path=url, default=default,
                   visibility="hidden" if hidden else "visible")


PAGES = {
    "mmlens": [
        # Streamlit serves the default page only at `/` (its own url_path is reserved but not
        # routed), so `/overview` is a hidden second page running the same script.
        page("pages/overview.py", "Overview", "dashboard", "index", default=True),
        page("pages/overview.py", "Overview", "dashboard", "overview", hidden=True),
        page("pages/inspector.py", "Request inspector", "view_timeline", "inspector"),
        page("pages/routing.py", "Routing", "alt_route", "routing"),
        page("pages/affinity.py", "Affinity", "image", "affinity"),
        page("pages/cache.py", "Cache", "memory", "cache"),
        page("pages/lab.py", "Lab", "science", "lab"),
        page("pages/whatif.py", "What if", "compare_arrows", "whatif"),
    ],
    "Settings": [
        page("pages/targets.py", "Targets", "settings", "targets"),
        page("pages/home.py", "About", "info", "about"),
    ],
}

# Narrow windows (about 800 px): a slimmer sidebar, and metric labels and values that wrap
# or shrink instead of being cut to "Engine hit r…". Static tables (mmlens.figures.html_table)
# ruled as Streamlit rules a Markdown table. Through st.html, not st.markdown: no Markdown on
# any page allows HTML, so a new tab never loads or runs Streamlit's raw-HTML Markdown plugin.
PAGE_CSS = """<style>
@media (max-width: 1000px) {
  section[data-testid="stSidebar"] { width: 190px !important; min-width: 190px !important; }
  [data-testid="stMetricLabel"] p, [data-testid="stMetricLabel"] div {
    white-space: normal !important; overflow: visible !important; }
  [data-testid="stMetricValue"] div, .mmlens-metric-value {
    font-size: 1.5rem !important; white-space: normal !important; }
  .block-container { padding-left: 1rem !important; padding-right: 1rem !important; }
}
table.mmlens-table { border-collapse: collapse; margin-bottom: 1rem; }
table.mmlens-table th { text-align: inherit; }
table.mmlens-table th, table.mmlens-table td {
  padding: 0.25rem 0.75rem; border: 1px solid rgba(49, 51, 63, 0.1); }
.mmlens-scroll table.mmlens-table { margin-bottom: 0; }
.mmlens-scroll thead th { position: sticky; top: 0; background: #fff; }
</style>"""
st.html(PAGE_CSS)

current = st.navigation(PAGES)
shared.time_controls()
shared.sidebar_status()
shared.load_tokenizers_soon()
warm_browser()
with shared.script_timer(current.url_path or "index"):
    current.run()
