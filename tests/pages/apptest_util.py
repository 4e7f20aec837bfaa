"""AppTest helpers: open one page of the app, read its Plotly figures as JSON and its SVG bar
charts as the bars drawn, and fail a test when `page_guard` turned an exception into an error
box it did not expect."""

from __future__ import annotations

import contextlib
import html.parser
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from mmlens.ui.shared import CAUGHT_KEY
from streamlit.testing.v1 import AppTest

from mmlens.figures.blocks import BLOCK_CLASS
from mmlens.figures.html_table import SCROLL_CLASS
from mmlens.figures.inserted import inserted_markup

APP = Path(__file__).resolve().parents[2] / "app.py"
PAGES = ("overview", "inspector", "routing", "affinity", "cache", "lab", "whatif", "targets")


def open_page(page: str, query: dict[str, str] | None = None, timeout: float = 60.0) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=timeout)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.run()
    return at.switch_page(f"pages/{page}.py").run()


def figures(at: AppTest) -> list[dict[str, Any]]:
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def parts(markup: str, wanted: str) -> list[str]:
    """``markup`` itself when its root's class begins with ``wanted``, or in a block of parts
    (``mmlens.figures.blocks``) or a scrolling box (``html_table.scrolling``) each such part,
    in order."""
    root = ET.fromstring(markup)
    if root.get("class", "").startswith(wanted):
        return [markup]
    if root.get("class") not in (BLOCK_CLASS, SCROLL_CLASS):
        return []
    return [ET.tostring(el, encoding="unicode") for el in root.iter()
            if el.get("class", "").startswith(wanted)]


def inserted(at: AppTest) -> list[str]:
    """The markup every ``st.html`` put in by its script shows, in page order."""
    found = (inserted_markup(str(el.value)) for el in at.get("html"))
    return [m for m in found if m is not None]


def charts(at: AppTest) -> list[str]:
    """The markup of every SVG chart the page shows (``shared.chart`` or in a block), in page
    order."""
    return [c for m in inserted(at) for c in parts(m, "mmlens-chart")]


def block_texts(at: AppTest) -> list[str]:
    """The text of every heading, caption and note the page's blocks show, in page order."""
    return ["".join(el.itertext()) for m in inserted(at) for part in parts(m, BLOCK_CLASS)
            for el in ET.fromstring(part).iter()
            if el.get("class") in ("mmlens-heading", "mmlens-caption", "mmlens-note")]


class _MetricCards(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if "mmlens-metric" in (a.get("class") or "").split() and a.get("data-label"):
            self.found[a["data-label"] or ""] = a.get("data-value") or ""


def metrics(at: AppTest) -> dict[str, str]:
    """Every headline number the page shows (``shared.metrics``' rows): label → value."""
    cards = _MetricCards()
    for el in at.get("html"):
        cards.feed(str(el.value))
    return cards.found


def svg_bars(at: AppTest, words: str) -> dict[str, list[Any]]:
    """The SVG bar chart (``mmlens.figures.svg``) whose title holds ``words``, as drawn: each
    bar's label, series, value, colour and tooltip."""
    for markup in charts(at):
        if 'class="mmlens-chart"' not in markup:
            continue
        root = ET.fromstring(markup)
        if words not in root.get("data-chart-title", ""):
            continue
        svg = "{http://www.w3.org/2000/svg}"
        bars = [g for g in root.iter(f"{svg}g") if g.get("data-label") is not None]
        return {"x": [g.get("data-label") for g in bars],
                "series": [g.get("data-series") for g in bars],
                "y": [float(g.get("data-value", "nan")) for g in bars],
                "colour": [g.find(f"{svg}rect").get("fill") for g in bars],  # type: ignore[union-attr]
                "hover": [g.findtext(f"{svg}title") for g in bars]}
    raise AssertionError(f"no SVG chart titled …{words}…")


def html_frame(markup: str) -> pd.DataFrame:
    """A static HTML table (``mmlens.figures.html_table``) as a frame: its header, its cells'
    text, a column whose every cell is a number (class "num") as numbers, a yes/no one
    (class "bool") as booleans."""
    root = ET.fromstring(markup)
    columns = [th.text or "" for th in root.iter("th")]
    body = root.find("tbody")
    cells = [list(tr.iter("td")) for tr in (body if body is not None else [])]
    df = pd.DataFrame([["".join(td.itertext()) for td in row] for row in cells],
                      columns=columns)
    for i, col in enumerate(columns):
        kinds = {row[i].get("class") for row in cells}
        if kinds == {"num"}:
            df[col] = pd.to_numeric(df[col].str.replace(",", ""))
        elif kinds == {"bool"}:
            df[col] = df[col] == "yes"
    return df


def frames(at: AppTest) -> list[pd.DataFrame]:
    """Every table a page shows, static HTML tables and data frames alike, in page order."""
    def walk(node: Any) -> Iterator[Any]:
        yield node
        for child in getattr(node, "children", {}).values():
            yield from walk(child)

    out = []
    for node in walk(at._tree):
        if node.type == "dataframe":
            out.append(node.value)
        elif node.type == "html" and node.value.startswith('<table class="mmlens-table"'):
            out.append(html_frame(node.value))
        elif node.type == "html" and (markup := inserted_markup(str(node.value))):
            out += [html_frame(t) for t in parts(markup, "mmlens-table")]
    return out


def drawn_decisions(at: AppTest) -> pd.DataFrame:
    """The Routing page's recent decisions (``shared.linked_request_table``) as a frame."""
    return next(d for d in frames(at) if {"request", "verdict", "why"} <= set(d.columns))


def decision_rows_drawn(at: AppTest) -> dict[str, tuple[str, str]]:
    """Each recent decision's request → (its row's CSS, its request cell's link)."""
    for markup in inserted(at):
        for table in parts(markup, "mmlens-table"):
            root = ET.fromstring(table)
            heads = [th.text for th in root.iter("th")]
            if "request" not in heads or "verdict" not in heads:
                continue
            col = heads.index("request")
            out = {}
            for tr in root.find("tbody") or []:
                cell = list(tr.iter("td"))[col]
                link = cell.find("a")
                rid = "".join(cell.itertext())
                out[rid] = (tr.get("style", ""), link.get("href", "") if link is not None
                            else "")
            return out
    raise AssertionError("no decisions table")


def lines_drawn(markup: str) -> dict[str, Any]:
    """An SVG line chart (``mmlens.figures.svg_lines``) read back in a Plotly figure's shape:
    one trace per series with its points' x, y, ids and tooltips, its colour and dash."""
    svg = "{http://www.w3.org/2000/svg}"
    root = ET.fromstring(markup)
    data = []
    for g in root.iter(f"{svg}g"):
        if g.get("data-series") is None:
            continue
        # a point standing for several ids (drawn once at one place) is read once per id
        points = [p for p in g.iter() if p.get("data-x") is not None
                  for _ in (p.get("data-ids") or "-").split()]
        ids = [i for p in g.iter() if p.get("data-x") is not None
               for i in (p.get("data-ids") or "").split() or [None]]
        path = g.find(f"{svg}path")
        data.append({"name": g.get("data-series"),
                     "x": [float(p.get("data-x", "nan")) for p in points],
                     "y": [float(p.get("data-y", "nan")) for p in points],
                     "ids": ids,
                     "links": [a.get("href") for a in points if a.tag == f"{svg}a"],
                     "hover": [p.findtext(f"{svg}title") for p in points],
                     "path": path.get("d") if path is not None else None,
                     "dash": path.get("stroke-dasharray") if path is not None else None,
                     "colour": path.get("stroke") if path is not None else None})
    return {"title": root.get("data-chart-title", ""), "data": data}


def chart_markup(at: AppTest, words: str) -> str:
    """The markup of the SVG chart whose title holds ``words``."""
    for markup in charts(at):
        if words in ET.fromstring(markup).get("data-chart-title", ""):
            return markup
    raise AssertionError(f"no SVG chart titled …{words}…")


def lines_titled(at: AppTest, words: str) -> dict[str, Any]:
    return lines_drawn(chart_markup(at, words))


def icicle_drawn(markup: str) -> dict[str, list[Any]]:
    """An SVG icicle (``mmlens.figures.icicle_svg``) as drawn: each band's id, parent, leaves,
    tooltip and rectangle (x, y, width, height)."""
    svg = "{http://www.w3.org/2000/svg}"
    bands = [g for g in ET.fromstring(markup).iter(f"{svg}g") if g.get("data-id") is not None]
    rects = [g.find(f"{svg}rect") for g in bands]
    return {"ids": [g.get("data-id") for g in bands],
            "parents": [g.get("data-parent") for g in bands],
            "leaves": [int(g.get("data-leaves", "0")) for g in bands],
            "hover": [g.findtext(f"{svg}title") for g in bands],
            "text": [g.findtext(f"{svg}text") for g in bands],
            "rect": [tuple(float(r.get(k, "nan")) for k in ("x", "y", "width", "height"))
                     for r in rects if r is not None]}


def sankey_links_drawn(markup: str) -> dict[str, list[Any]]:
    """The SVG Sankey (``mmlens.figures.affinity``) as drawn: each band's image label, worker
    label, requests and tooltip, and every node's label."""
    svg = "{http://www.w3.org/2000/svg}"
    root = ET.fromstring(markup)
    bands = [g for g in root.iter(f"{svg}g") if g.get("data-value") is not None]
    return {"source": [g.get("data-source") for g in bands],
            "target": [g.get("data-target") for g in bands],
            "value": [int(g.get("data-value", "0")) for g in bands],
            "hover": [g.findtext(f"{svg}title") for g in bands],
            "nodes": [g.get("data-node") for g in root.iter(f"{svg}g")
                      if g.get("data-node") is not None]}


def sankey_drawn(at: AppTest) -> dict[str, list[Any]]:
    """The Affinity page's Sankey, as drawn (``sankey_links_drawn``)."""
    for markup in charts(at):
        if 'class="mmlens-chart mmlens-sankey"' in markup:
            return sankey_links_drawn(markup)
    raise AssertionError("no SVG Sankey drawn")


def layout_drawn(at: AppTest) -> dict[str, Any]:
    """The Inspector's SVG token layout (``mmlens.figures.layout_svg``) read back in the
    token-layout figure's shape: one bar trace per series (its rows ``y`` and lengths ``x``),
    the blocks' tooltips, the divergent blocks' labels."""
    svg = "{http://www.w3.org/2000/svg}"
    for markup in charts(at):
        if 'class="mmlens-chart mmlens-layout"' not in markup:
            continue
        root = ET.fromstring(markup)
        data: dict[str, dict[str, Any]] = {}
        for g in root.iter(f"{svg}g"):
            if g.get("data-series") is not None:
                t = data.setdefault(g.get("data-series", ""), {
                    "name": g.get("data-series"), "type": "bar", "x": [], "y": []})
                t["x"].append(int(g.get("data-length", "0")))
                t["y"].append(g.get("data-row"))
            elif g.get("data-block-row") is not None:
                data.setdefault("blocks", {"name": "blocks", "hovertext": []})[
                    "hovertext"].append(g.findtext(f"{svg}title"))
        notes = [{"text": el.get("data-annotation")} for el in root.iter(f"{svg}text")
                 if el.get("data-annotation")]
        return {"data": list(data.values()), "layout": {"annotations": notes}}
    raise AssertionError("no SVG token layout drawn")


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


class CaughtByPageGuard(AssertionError):
    """A page run ended well only because page_guard caught an exception."""


_expecting: list[list[str]] = []  # the open expect_caught() blocks, innermost last


def caught(at: AppTest) -> list[str]:
    """What page_guard caught during the last run of `at` ("what: Type: message" each)."""
    try:
        return list(at.session_state[CAUGHT_KEY])
    except KeyError:
        return []


@contextlib.contextmanager
def expect_caught() -> Iterator[list[str]]:
    """Declares that page_guard should catch an exception in the runs inside: they do not fail
    the test, the yielded list gets what was caught, and the block fails if nothing was."""
    got: list[str] = []
    _expecting.append(got)
    try:
        yield got
    finally:
        _expecting.remove(got)
    assert got, "page_guard caught nothing in an expect_caught() block"


@contextlib.contextmanager
def fail_on_caught() -> Iterator[None]:
    """Every AppTest run inside (a widget interaction too) raises CaughtByPageGuard when
    page_guard caught an exception outside an expect_caught() block."""
    original = AppTest._run

    def run(self: AppTest, *args: Any, **kwargs: Any) -> AppTest:
        self.session_state[CAUGHT_KEY] = []  # this run's only
        result = original(self, *args, **kwargs)
        got = caught(self)
        if got and _expecting:
            _expecting[-1].extend(got)
        elif got:
            raise CaughtByPageGuard("page_guard caught (wrap the run in expect_caught() if the "
                                    "test wants that): " + "; ".join(got))
        return result

    AppTest._run = run  # type: ignore[method-assign]
    try:
        yield
    finally:
        AppTest._run = original  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def strict_page_guard() -> Iterator[None]:
    """Autouse where imported: a test fails on an exception page_guard caught, unless the run
    was inside expect_caught()."""
    with fail_on_caught():
        yield
