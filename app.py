"""Streamlit entry point: `streamlit run app.py` (or `mmlens dashboard`)."""

import streamlit as st

st.set_page_config(page_title="mmlens", page_icon="🔎", layout="wide")

PAGES = [
    st.Page("pages/home.py", title="Home", icon="🏠", default=True),
]

st.navigation(PAGES).run()
