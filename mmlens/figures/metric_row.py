"""A row of headline numbers as one piece of static HTML, for ``st.html``.

A row of ``st.metric`` in ``st.columns`` is, per number, a column block and a metric element
whose label is parsed as Markdown and whose help is a tooltip component: the Overview's two
rows were 17 of its 30 elements, and a new tab renders each through React (the Metric chunk,
emotion styles, a Markdown parse per label). One ``st.html`` draws the row instead: the same
label over value (over delta), the help as the card's tooltip."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mmlens.figures.svg import esc

ROW_CLASS = "mmlens-metrics"
# Streamlit's own metric: a 0.875rem label over a 2.25rem value; side by side in equal
# columns, wrapping onto more lines in a narrow window
ROW_STYLE = ("display:grid;grid-template-columns:repeat(auto-fit,minmax(9rem,1fr));gap:1rem;"
             "margin-bottom:1rem")
LABEL_STYLE = "font-size:0.875rem;line-height:1.4;overflow-wrap:anywhere"
VALUE_STYLE = "font-size:2.25rem;line-height:1.2;padding-bottom:0.25rem;overflow-wrap:anywhere"
DELTA_COLOURS = {"good": "rgb(9, 171, 59)", "bad": "rgb(255, 43, 43)", None: "rgb(128, 132, 149)"}


@dataclass(frozen=True)
class Metric:
    label: str
    value: str
    help: str | None = None
    delta: str | None = None
    delta_is: str | None = None  # "good" (green), "bad" (red) or None (grey)


def metric_row(metrics: Sequence[Metric]) -> str:
    """``metrics`` side by side, each as its label, value and delta; label and value are also
    the card's data attributes (what tests and scripts read)."""
    cards = []
    for m in metrics:
        tip = f' title="{esc(m.help)}"' if m.help else ""
        # a dotted underline says the label has a tooltip (no glyph every font has)
        hint = ";text-decoration:underline dotted;text-underline-offset:3px" if m.help else ""
        delta = ""
        if m.delta:
            arrow = "↓" if m.delta.lstrip().startswith("-") else "↑"
            delta = (f'<div class="mmlens-metric-delta" style="font-size:1rem;'
                     f'color:{DELTA_COLOURS.get(m.delta_is, DELTA_COLOURS[None])}">'
                     f"{arrow} {esc(m.delta)}</div>")
        cards.append(
            f'<div class="mmlens-metric" data-label="{esc(m.label)}" '
            f'data-value="{esc(m.value)}"{tip}>'
            f'<div class="mmlens-metric-label" style="{LABEL_STYLE}{hint}">{esc(m.label)}</div>'
            f'<div class="mmlens-metric-value" style="{VALUE_STYLE}">{esc(m.value)}</div>'
            f"{delta}</div>")
    return (f'<div class="{ROW_CLASS}" style="{ROW_STYLE}">'
            + "".join(cards) + "</div>")
