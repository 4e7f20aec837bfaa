"""Streamlit entry point: `streamlit run app.py` (or `mmlens dashboard`)."""

import streamlit as st
from mmlens.ui import shared

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
    ],
    "Settings": [
        page("pages/targets.py", "Targets", "settings", "targets"),
        page("pages/home.py", "About", "info", "about"),
    ],
}

current = st.navigation(PAGES)
shared.time_controls()
shared.sidebar_status()
current.run()
