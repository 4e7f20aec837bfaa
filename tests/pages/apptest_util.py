"""AppTest helpers: open one page of the app, read its Plotly figures as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from streamlit.testing.v1 import AppTest

APP = Path(__file__).resolve().parents[2] / "app.py"
PAGES = ("overview", "inspector", "routing", "affinity", "cache", "lab", "targets")


def open_page(page: str, query: dict[str, str] | None = None, timeout: float = 60.0) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=timeout)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.run()
    return at.switch_page(f"pages/{page}.py").run()


def figures(at: AppTest) -> list[dict[str, Any]]:
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def figure_titled(at: AppTest, words: str) -> dict[str, Any]:
    for fig in figures(at):
        title = fig.get("layout", {}).get("title", {})
        text = title.get("text", "") if isinstance(title, dict) else str(title)
        if words in text:
            return fig
    raise AssertionError(f"no figure titled …{words}… among {len(figures(at))}")


def trace_names(fig: dict[str, Any]) -> list[str]:
    return [t.get("name") or t.get("type") for t in fig["data"]]


def messages(at: AppTest) -> dict[str, list[str]]:
    return {"error": [e.value for e in at.error], "warning": [w.value for w in at.warning],
            "info": [i.value for i in at.info], "success": [s.value for s in at.success]}


def assert_clean(at: AppTest) -> None:
    """No exception element (a traceback) on the page."""
    assert not at.exception, [e.value for e in at.exception]
