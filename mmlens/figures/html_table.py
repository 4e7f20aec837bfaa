"""A small table as one line of static HTML, for tables that are read, not sorted or searched.

``st.dataframe`` draws with its own grid (a canvas, and its JavaScript chunk with Arrow,
number and date formatting): a new tab that shows one loads and evaluates all of it, for a
table of two routers. A small table is static HTML (``st.html``) instead; a table too long to
read on one screen stays a data frame (it scrolls and sorts)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from numbers import Number
from typing import Any

from mmlens.figures.svg import esc

MAX_ROWS = 25  # more rows than this: a data frame
SCROLL_CLASS = "mmlens-scroll"


def cell_text(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def html_table(columns: Sequence[str], rows: Iterable[Sequence[Any]],
               column_help: Mapping[str, str] | None = None,
               row_styles: Sequence[str] | None = None,
               links: Mapping[str, Sequence[str]] | None = None) -> str:
    """``rows`` under ``columns`` (numbers right-aligned, a gap as "—"); a column's help is
    its header's tooltip. ``row_styles``: each row's CSS ("": none); ``links``: for a column,
    each row's cell as a link to that URL in this tab ("": plain)."""
    helps = column_help or {}
    head = "".join(f'<th title="{esc(helps[c])}">{esc(c)}</th>' if c in helps else
                   f"<th>{esc(c)}</th>" for c in columns)
    linked = {columns.index(c): urls for c, urls in (links or {}).items() if c in columns}
    body = []
    for i, row in enumerate(rows):
        cells = []
        for j, v in enumerate(row):
            if isinstance(v, bool):
                style = ' class="bool"'
            elif isinstance(v, Number):
                style = ' class="num" style="text-align:right"'
            else:
                style = ""
            text = esc(cell_text(v))
            url = linked[j][i] if j in linked and i < len(linked[j]) else ""
            if url:
                text = f'<a href="{esc(url)}" target="_self">{text}</a>'
            cells.append(f"<td{style}>{text}</td>")
        css = row_styles[i] if row_styles and i < len(row_styles) else ""
        tr = f'<tr style="{esc(css)}">' if css else "<tr>"
        body.append(tr + "".join(cells) + "</tr>")
    return (f'<table class="mmlens-table" style="font-size:0.875rem;width:100%">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def scrolling(table: str, max_height: str = "32rem") -> str:
    """``table`` in a box of at most ``max_height`` that scrolls both ways, its header kept
    in view."""
    return (f'<div class="{SCROLL_CLASS}" style="max-height:{max_height};overflow:auto">'
            f"{table}</div>")
