"""Small tables as static HTML (``mmlens.figures.html_table``): what is drawn, read back."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from mmlens.figures.html_table import cell_text, html_table, scrolling


def test_html_table_cells_headers_and_alignment() -> None:
    markup = html_table(["name", "blocks", "rate", "note"],
                        [("w1 <a>", 12, 0.25, None), ("w2", 3, 1.0, False)],
                        {"rate": "hit rate over 5 min"})
    root = ET.fromstring(markup)
    heads = [th.text for th in root.iter("th")]
    assert heads == ["name", "blocks", "rate", "note"]
    assert [th.get("title") for th in root.iter("th")] == [None, None, "hit rate over 5 min",
                                                           None]
    body = root.find("tbody")
    assert body is not None
    rows = [[td.text for td in tr.iter("td")] for tr in body]
    assert rows == [["w1 <a>", "12", "0.25", "—"], ["w2", "3", "1", "no"]]  # escaped, gaps "—"
    assert [td.get("class") for td in body[1].iter("td")] == [None, "num", "num", "bool"]
    assert "\n" not in markup  # one line: Markdown reads it as one HTML block


def test_cell_text_reads_as_a_data_frame_would() -> None:
    assert [cell_text(v) for v in (3.0, 0.123456, 12345.6, True, "x", None)] == [
        "3", "0.1235", "12,346", "yes", "x", "—"]


def test_rows_carry_their_style_and_a_column_its_links() -> None:
    markup = html_table(["request", "verdict"], [("r1", "hit"), ('r"2', "miss")],
                        row_styles=["background-color: #e3f6ea", ""],
                        links={"request": ["inspector?request=r1", 'x?r="2"'],
                               "absent": ["nowhere"]})
    body = ET.fromstring(markup).find("tbody")
    assert body is not None
    assert [tr.get("style") for tr in body] == ["background-color: #e3f6ea", None]
    links = [tr.find("td/a") for tr in body]
    assert [(a.get("href"), a.get("target"), a.text) for a in links if a is not None] == [
        ("inspector?request=r1", "_self", "r1"), ('x?r="2"', "_self", 'r"2')]  # escaped
    assert [td.find("a") for td in body.iter("td")][1::2] == [None, None]  # verdicts plain
    boxed = ET.fromstring(scrolling(markup, "10rem"))
    assert "max-height:10rem" in (boxed.get("style") or "")
    assert boxed.find("table") is not None
