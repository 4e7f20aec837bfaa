"""The request table's row colours, built once for the whole frame, are what a styler
function per row gave: each cell its row's verdict colour."""

from __future__ import annotations

import pandas as pd

from mmlens.analysis.views.common import verdict_css


def test_every_cell_takes_its_rows_verdict_colour() -> None:
    from mmlens.ui.shared import table, verdict_rows_css

    df = table([{"request": "a", "verdict": "false_hit", "worker": "w1", "blocks": 3},
                {"request": "b", "verdict": "hit", "worker": None, "blocks": None},
                {"request": "c", "verdict": "unknown", "worker": "w2", "blocks": 1}])
    css = verdict_rows_css(df)
    per_row = df.apply(lambda row: [verdict_css(row.get("verdict"))] * len(row), axis=1,
                       result_type="expand")
    per_row.columns = df.columns
    pd.testing.assert_frame_equal(css, per_row)
    assert css.loc[0, "blocks"] == verdict_css("false_hit") != css.loc[1, "blocks"]
    assert set(css.loc[2]) == {""}  # unknown: unmarked
    styled = df.style.apply(lambda _: css, axis=None)
    styled._compute()
    assert styled.ctx[(0, 3)] == [("background-color", verdict_css("false_hit").split(": ")[1])]
    no_verdicts = table([{"request": "x"}])
    assert set(verdict_rows_css(no_verdicts).loc[0]) == {""}
