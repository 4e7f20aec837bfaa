"""About: what mmlens shows, the words its pages use, and a picture of one request's tokens."""

import pandas as pd
import streamlit as st

from mmlens.analysis.request_view import from_layout
from mmlens.errors import LayoutError
from mmlens.figures.token_layout import layout_figure
from mmlens.layout.composition import ImageInput
from mmlens.layout.modeldir import resolve_model

st.title("About mmlens")
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

st.subheader("One request's tokens")
st.caption("A Qwen3-VL chat request with one 640x480 image and a sentence, cut into 16-token "
           "blocks: the router's view expands the image into 300 image tokens; the worker "
           "view keeps one placeholder per image (what a router forwards in worker mode).")
try:
    model = resolve_model("qwen3-vl")
    layout = model.layout([ImageInput(640, 480), "What is in this picture?"], block_size=16)
    st.plotly_chart(layout_figure(from_layout(layout, ["image-A"]), "qwen3-vl: 640x480 + text"),
                    key="about_layout", width="stretch")
except (LayoutError, ValueError, OSError) as exc:
    st.caption(f"(the example layout could not be built here: {exc})")

st.subheader("Vocabulary")
TERMS = [
    ("anchor view", "the rendered prompt with one anchor (placeholder) token per image, before "
     "any expansion"),
    ("router view", "router-mode expansion: each image's anchor replaced by its N image "
     "tokens; what SMG's gRPC router and Dynamo hash into blocks to pick a worker"),
    ("worker view", "what a router forwards in worker mode: anchors unexpanded, the worker's "
     "processor expands them"),
    ("block", "16 tokens (the usual KV block size); a router matches and an engine caches "
     "whole blocks only"),
    ("image identity", "how a party names an image: SMG hashes its bytes (blake3), Dynamo the "
     "URL string (XXH3-64), vLLM the decoded pixels"),
    ("hit", "the engine served most of the prompt from its prefix cache"),
    ("cold", "nothing of it was cached anywhere yet (a first send: a seed)"),
    ("false hit", "the router predicted cached blocks the engine did not have; on SMG usually "
     "content-blind: another image of the same size expands to the same token ids"),
    ("spilled", "another worker held more of it, and the router sent it elsewhere (load "
     "balance or its spill gate)"),
    ("count drift", "the engine expanded an image to another number of tokens than the router "
     "assumed, so every block after it shifts"),
    ("fallback", "the router routed on text alone (image dims not fetched, unsupported family)"),
    ("evicted", "the blocks were dropped between the router's decision and the prefill"),
    ("events blind", "the router gets no KV events from a worker, so it cannot see its cache"),
    ("better worker", "the worker that held the most of the request's blocks when it was "
     "routed (from the workers' KV events)"),
    ("available vs achieved", "tokens the best worker held vs tokens the request got from "
     "cache; the difference is avoidable prefill"),
    ("index gauge", "SMG's exported count of blocks in its positional index "
     "(smg_kv_index_blocks), compared with the engines' own"),
    ("event index overlap", "SMG's routing mode that matches a request's blocks against the "
     "index built from the workers' KV events"),
    ("images keyed", "how the router routed a request's images: exact (by content), degraded "
     "(by token ids, blind to which image filled them, or with a count drift), text_prefix "
     "(on text alone)"),
    ("seed", "the first send of some images in a Lab run: nothing of it can be cached yet"),
    ("pending / firing / resolved", "an alert's state: its condition seen but not held long "
     "enough yet, held past its hold time, or cleared in the last 5 minutes"),
]
st.table(pd.DataFrame(TERMS, columns=["term", "meaning"]).set_index("term"))
