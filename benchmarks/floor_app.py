"""The floor of a Streamlit page in a browser: a title and one line, nothing read, no sidebar.

pages_browser.py opens it beside every fresh load of a dashboard page, in the same browser
and the same way, so the time Streamlit's own frontend takes on this machine at that moment
is printed next to the pages' figures."""

import streamlit as st

st.set_page_config(page_title="floor", layout="wide")
st.title("Floor")
st.write("Ready")
