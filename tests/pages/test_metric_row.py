"""Headline numbers as one static HTML row (``mmlens.figures.metric_row``): what is drawn,
read back; the pages that show them draw no ``st.metric`` or column for them."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from mmlens.figures.metric_row import DELTA_COLOURS, Metric, metric_row
from tests.pages.apptest_util import metrics, open_page
from tests.pages.recorded_store import Recorded


def test_metric_row_labels_values_tooltips_and_delta() -> None:
    markup = metric_row([Metric("Hit <rate>", "28%", help='Σ hit / Σ "queried"'),
                         Metric("Tokens", "81", delta="+3 vs expected", delta_is="bad"),
                         Metric("Drift", "12", delta="-2")])
    root = ET.fromstring(markup)
    cards = [d for d in root if d.get("class") == "mmlens-metric"]
    assert [(c.get("data-label"), c.get("data-value")) for c in cards] == [
        ("Hit <rate>", "28%"), ("Tokens", "81"), ("Drift", "12")]
    assert [c.get("title") for c in cards] == ['Σ hit / Σ "queried"', None, None]
    texts = [["".join(div.itertext()) for div in c] for c in cards]
    assert texts == [["Hit <rate>", "28%"], ["Tokens", "81", "↑ +3 vs expected"],
                     ["Drift", "12", "↓ -2"]]
    assert ["dotted" in (c[0].get("style") or "") for c in cards] == [True, False, False]
    deltas = [c[2].get("style") for c in cards[1:]]
    assert DELTA_COLOURS["bad"] in deltas[0] and DELTA_COLOURS[None] in deltas[1]
    assert "\n" not in markup


def test_headline_pages_draw_their_numbers_as_one_row_each(db: Recorded) -> None:
    at = open_page("overview")
    shown = metrics(at)
    assert list(shown) == ["Engine hit rate (token-weighted)", "Router-predicted hit rate",
                           "Image requests in router mode", "Image requests in worker mode",
                           "Achieved vs available hit rate", "Avoidable prefill tokens / min",
                           "Top cause"]
    # no element per number: no st.metric, and no column holding one
    assert not at.metric and not at.columns
