"""Small tables as static HTML (``mmlens.figures.html_table``): what is drawn, read back."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from mmlens.figures.html_table import cell_text, html_table


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
