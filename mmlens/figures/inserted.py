"""Chart markup put into a page by the browser's own HTML parser, not Streamlit's Markdown.

``st.markdown(unsafe_allow_html=True)`` hands raw HTML to Streamlit's Markdown: rehype-raw
parses it in JavaScript and every node becomes a React element (a fresh Cache tab on the
100k-request store spent 0.7–0.9 s of main-thread script there on ~440 kB of SVG).
``st.html`` sets its body as ``innerHTML``, but its sanitizer (DOMPurify's HTML profile)
removes every SVG element. So the markup travels as a string in a script ``st.html`` runs
(``unsafe_allow_javascript``), which hands it to ``insertAdjacentHTML`` and removes itself.
Nothing sanitizes it on the way: only markup whose builder escapes every value it writes
(``mmlens.figures``' SVG and table builders) may go through here."""

from __future__ import annotations

import json
import re

HOST = "mmlens-inserted"  # the class of the element the markup is put into

_SCRIPT = re.compile(r'^<div class="' + HOST + r'"><script>\(\(\) => \{ '
                     r"const s = document\.currentScript; "
                     r's\.insertAdjacentHTML\("beforebegin", (".*")\); '
                     r"s\.remove\(\); \}\)\(\)</script></div>$", re.S)


def inserting_html(markup: str) -> str:
    """``st.html`` body (with ``unsafe_allow_javascript=True``) that shows ``markup``."""
    # every "<" escaped: no "</script>" ends the script early, and DOMPurify (SAFE_FOR_XML)
    # removes an element whose text looks like markup
    text = json.dumps(markup).replace("<", "\\u003c")
    return (f'<div class="{HOST}"><script>(() => {{ const s = document.currentScript; '
            f's.insertAdjacentHTML("beforebegin", {text}); s.remove(); }})()</script></div>')


def inserted_markup(body: str) -> str | None:
    """The markup an ``inserting_html`` body shows (None for any other body)."""
    m = _SCRIPT.match(body)
    return str(json.loads(m.group(1))) if m else None
