"""Chart markup carried in a script st.html runs (mmlens.figures.inserted): the script holds
no "<" (nothing in the markup can end it early, and DOMPurify keeps it), and reads back as the
markup it was given."""

from __future__ import annotations

import json
import re

from mmlens.figures.inserted import HOST, inserted_markup, inserting_html
from mmlens.figures.svg import Bar, BarChart, bar_chart_html


def test_the_markup_reads_back_whole_and_the_script_holds_no_tag() -> None:
    markup = bar_chart_html(BarChart("t </script><b>", [Bar("w1 </script>", 3.0, "a & b")]))
    body = inserting_html(markup)
    script = re.fullmatch(f'<div class="{HOST}"><script>(.*)</script></div>', body, re.S)
    assert script is not None
    assert "<" not in script.group(1)
    assert inserted_markup(body) == markup
    # the string literal is JSON: the browser's parser gets exactly the markup
    literal = script.group(1).split('"beforebegin", ', 1)[1].rsplit("); s.remove()", 1)[0]
    assert json.loads(literal) == markup


def test_other_bodies_are_no_inserted_markup() -> None:
    assert inserted_markup("<p>hello</p>") is None
    assert inserted_markup(inserting_html("<svg></svg>")[:-6]) is None
