import streamlit as st

st.title("mmlens")
st.markdown(
    """
mmlens shows what happens to **one multimodal request** on its way through a KV-cache-aware
router (SMG, NVIDIA Dynamo) to a GPU worker (vLLM, SGLang): how each image's placeholder
becomes N tokens, which blocks the router hashes, which worker it picked and why, and how
much of the prompt the worker really found in its cache.

Use it to debug routing misses, to demo cache reuse, and to compare router-mode and
worker-mode prompt token counts.
"""
)
