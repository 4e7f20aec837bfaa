"""A run of a page's static parts (charts, tables, headings, captions, notes) as one block of
markup, put in by one ``st.html`` (``mmlens.figures.inserted``).

A new tab builds every Streamlit element through React: its container, emotion styles and,
for a caption or subheader, a Markdown parse. On a fleet the Cache page was 34 elements; one
block per run of static parts between its widgets draws the same text and charts as a few.
Styles copy Streamlit's own caption, subheader and info box. Every builder escapes what it
writes: the block is not sanitized on its way in."""

from __future__ import annotations

from collections.abc import Iterable

from mmlens.figures.svg import esc

BLOCK_CLASS = "mmlens-block"
# Streamlit's element gap between parts; side by side in two equal columns, one under the
# other in a narrow window
BLOCK_STYLE = "display:flex;flex-direction:column;gap:1rem"
PAIR_STYLE = "display:grid;grid-template-columns:repeat(auto-fit,minmax(24rem,1fr));gap:1rem"
CAPTION_STYLE = "font-size:0.875rem;color:rgba(49,51,63,0.6);margin:0;overflow-wrap:anywhere"
HEADING_STYLE = "font-size:1.5rem;font-weight:600;line-height:1.2;margin:0;padding:1rem 0 0"
NOTE_STYLE = ("background:rgba(28,131,225,0.1);color:rgb(0,66,128);border-radius:0.5rem;"
              "padding:1rem;margin:0;font-size:1rem")


def block_html(parts: Iterable[str]) -> str:
    """``parts`` (each markup from this module or ``mmlens.figures``' builders) one under the
    other."""
    return f'<div class="{BLOCK_CLASS}" style="{BLOCK_STYLE}">' + "".join(parts) + "</div>"


def pair_html(left: str, right: str) -> str:
    """Two parts side by side (``st.columns(2)``)."""
    return (f'<div class="mmlens-pair" style="{PAIR_STYLE}"><div>{left}</div>'
            f"<div>{right}</div></div>")


def caption_html(text: str, strong: str = "") -> str:
    """``text`` as a caption; ``strong``: a bold lead-in, in the body's colour and size."""
    if strong:
        return (f'<p class="mmlens-caption" style="margin:0"><strong>{esc(strong)}</strong>'
                f" {esc(text)}</p>")
    return f'<p class="mmlens-caption" style="{CAPTION_STYLE}">{esc(text)}</p>'


def heading_html(text: str) -> str:
    """``text`` as a section heading (``st.subheader``)."""
    return f'<h3 class="mmlens-heading" style="{HEADING_STYLE}">{esc(text)}</h3>'


def note_html(text: str) -> str:
    """``text`` in an info box (``st.info``)."""
    return f'<div class="mmlens-note" role="note" style="{NOTE_STYLE}">{esc(text)}</div>'
