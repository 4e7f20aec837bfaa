"""A block of static parts (``mmlens.figures.blocks``) is not sanitized on its way into the
page: every text it writes is escaped, and it stays one well-formed element in page order."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from mmlens.figures.blocks import (
    BLOCK_CLASS,
    block_html,
    caption_html,
    heading_html,
    note_html,
    pair_html,
)
from mmlens.figures.inserted import inserted_markup, inserting_html


def test_a_block_escapes_its_texts_and_keeps_their_order() -> None:
    evil = '<img src=x onerror="alert(1)"> & </script>'
    markup = block_html([heading_html(evil), pair_html(note_html(evil), caption_html(evil)),
                         caption_html("(newest first)", strong=evil)])
    assert "<img" not in markup and "</script>" not in markup
    root = ET.fromstring(markup)  # well-formed: one element, what the tests' helpers read
    assert root.get("class") == BLOCK_CLASS
    texts = ["".join(el.itertext()) for el in root.iter()
             if el.get("class") in ("mmlens-heading", "mmlens-note", "mmlens-caption")]
    assert texts == [evil, evil, evil, f"{evil} (newest first)"]
    assert inserted_markup(inserting_html(markup)) == markup
