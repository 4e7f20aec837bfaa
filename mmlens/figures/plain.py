"""A figure given as a plain Plotly spec dict, for the charts a page draws on every run.

Building ``go.Figure`` objects validates and copies every property: for a chart of ten
300-point lines ~115 ms, and ~30 ms more when Streamlit turns it back into a dict, against
~3 ms to serialize the same spec as a dict. ``PlainFigure`` is a ``go.Figure`` to
``st.plotly_chart`` (which takes a figure's ``to_dict()`` as already valid) that hands over
its spec as written; ``data`` and ``layout`` build the validated figure on first use
(tests read them), so nothing is validated on a page run. A spec must spell every property
as Plotly.js reads it (``title: {"text": …}``, not the string shorthand)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go


class PlainFigure(go.Figure):
    def __init__(self, spec: dict[str, Any]) -> None:  # no go.Figure set-up: that validates
        self._spec = spec
        self._built: go.Figure | None = None

    def to_dict(self) -> dict[str, Any]:
        return self._spec

    def _figure(self) -> go.Figure:
        if self._built is None:
            self._built = go.Figure(self._spec)
        return self._built

    @property
    def data(self) -> Any:
        return self._figure().data

    @property
    def layout(self) -> Any:
        return self._figure().layout

    def __repr__(self) -> str:
        return f"PlainFigure({len(self._spec.get('data', []))} traces)"
