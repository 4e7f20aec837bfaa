"""Streamlit entry point: `streamlit run app.py` (or `mmlens dashboard`)."""

import streamlit as st

st.set_page_config(page_title="mmlens", page_icon="🔎", layout="wide")

PAGES = {
    "mmlens": [
        st.Page("pages/overview.py", title="Overview", icon="📊", url_path="overview",
                default=True),
        st.Page("pages/inspector.py", title="Request inspector", icon="🧩",
                url_path="inspector"),
        st.Page("pages/routing.py", title="Routing", icon="🔀", url_path="routing"),
        st.Page("pages/affinity.py", title="Affinity", icon="🖼️", url_path="affinity"),
        st.Page("pages/cache.py", title="Cache", icon="🗄️", url_path="cache"),
        st.Page("pages/lab.py", title="Lab", icon="🧪", url_path="lab"),
    ],
    "Settings": [
        st.Page("pages/targets.py", title="Targets", icon="🎯", url_path="targets"),
        st.Page("pages/home.py", title="About", icon="🏠", url_path="about"),
    ],
}

st.navigation(PAGES).run()
