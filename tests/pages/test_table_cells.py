"""Tables on the pages never show "None": gaps read "—" and a column keeps one type."""

from __future__ import annotations

import math

from mmlens.ui.shared import EMPTY_CELL, table


def test_gaps_read_as_a_dash_and_the_column_stays_one_type() -> None:
    df = table([{"worker": "w1", "score": 3, "gate": None},
                {"worker": "w2", "score": None, "gate": math.nan},
                {"worker": "w3", "score": 1.5, "gate": True}])
    assert list(df["score"]) == ["3", EMPTY_CELL, "1.5"]
    assert list(df["gate"]) == [EMPTY_CELL, EMPTY_CELL, "True"]
    assert {type(v) for v in df["score"]} == {str}
    assert "None" not in df.to_string()


def test_columns_without_gaps_keep_their_numbers() -> None:
    df = table([{"tokens": 64, "worker": "w1"}, {"tokens": 80, "worker": "w2"}])
    assert df["tokens"].dtype.kind == "i" and list(df["tokens"]) == [64, 80]


def test_workers_read_in_name_order_per_router() -> None:
    from mmlens.analysis.views.common import by_worker_name
    rows = [{"router": "dynamo", "worker": "w2"}, {"router": "dynamo", "worker": "w10"},
            {"router": "dynamo", "worker": "w1"}, {"router": "a-smg", "worker": "w3"}]
    assert [(r["router"], r["worker"]) for r in by_worker_name(rows)] == [
        ("a-smg", "w3"), ("dynamo", "w1"), ("dynamo", "w2"), ("dynamo", "w10")]


def test_markdown_table_reads_as_written() -> None:
    """A cell's Markdown and LaTeX characters are escaped, a gap reads "—", a newline a
    space; nested evidence is one JSON cell."""
    from mmlens.analysis.views.common import markdown_table
    from mmlens.analysis.views.inspector import evidence_rows

    md = markdown_table([{"": "a|b", "x": None, "y": "$5 *x* _y_"}, {"": "c", "x": 1, "y": "1\n2"}])
    assert md.splitlines() == ["|   | x | y |", "|---|---|---|",
                               "| a\\|b | — | \\$5 \\*x\\* \\_y\\_ |", "| c | 1 | 1 2 |"]
    assert markdown_table([]) == ""
    assert evidence_rows({"blocks": [1, 2], "why": "held"}) == [
        {"field": "blocks", "value": "[1, 2]"}, {"field": "why", "value": "held"}]
