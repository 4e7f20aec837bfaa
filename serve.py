"""What `mmlens dashboard` serves: the app (app.py) behind the page-HTML middleware
(mmlens.ui.root_base). `streamlit run serve.py` finds ``app`` and serves it."""

from pathlib import Path

import streamlit as st
from mmlens.ui.root_base import RootBase
from mmlens.ui.warmup import warm_server
from starlette.middleware import Middleware

app = st.App(Path(__file__).resolve().parent / "app.py", middleware=[Middleware(RootBase)])
warm_server()
