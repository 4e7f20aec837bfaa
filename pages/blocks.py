"""A page's static parts gathered into one ``st.html`` per run of them
(``mmlens.figures.blocks``): added in page order, put on the page when a widget, an alert or
a data frame comes next (``flush``) and at the end of the ``with``."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import streamlit as st
from mmlens.ui import shared

from mmlens.figures.blocks import block_html, caption_html, heading_html
from mmlens.figures.inserted import inserting_html


class Static:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, markup: str) -> None:
        self.parts.append(markup)

    def heading(self, text: str) -> None:
        self.add(heading_html(text))

    def caption(self, text: str, strong: str = "") -> None:
        self.add(caption_html(text, strong))

    def table(self, rows: Any, column_help: dict[str, str] | None = None) -> None:
        """``rows`` as ``shared.small_table`` shows them: a table too long for the block is a
        data frame after the parts added so far."""
        df = shared.table(rows)
        if len(df) > shared.MAX_TABLE_ROWS:
            self.flush()
        markup = shared.table_markup(df, column_help)
        if isinstance(markup, str):
            self.add(markup)

    def flush(self) -> None:
        if self.parts:
            st.html(inserting_html(block_html(self.parts)), unsafe_allow_javascript=True)
            self.parts = []

    def __enter__(self) -> Static:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.flush()
