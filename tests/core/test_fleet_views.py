"""Fleet-scale views: the busiest workers by name, the rest summed, no block lost."""

from __future__ import annotations

from mmlens.analysis.fleet import fold_timeline, other_label


def test_timeline_keeps_the_busiest_workers_and_sums_the_rest() -> None:
    rows = [(float(b), f"w{w:03d}", kind, w + 1)
            for w in range(100) for b in (0, 10) for kind in ("stored", "removed")]
    folded = fold_timeline(rows, keep=3)
    assert {w for _, w, _, _ in folded} == {"w099", "w098", "w097", other_label(97)}
    assert sum(n for *_, n in folded) == sum(n for *_, n in rows)
    others = {(b, k): n for b, w, k, n in folded if w == other_label(97)}
    assert others[(0.0, "removed")] == sum(range(1, 98))
    assert fold_timeline(rows[:8], keep=3) == rows[:8]  # two workers: nothing to fold
