"""A comparison as rows of text, for `mmlens whatif` and the What if page alike: one column
per scenario beside the recording and the baseline, the baseline's error (model − measured)
after each figure, the verdicts in the dashboard's vocabulary, and the hit rate per minute."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from mmlens.whatif.compare import Comparison
from mmlens.whatif.report import Figures


def pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


def num(v: float | None) -> str:
    return "—" if v is None else f"{v:,.0f}"


def ratio(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


ROWS: tuple[tuple[str, str, Callable[[float | None], str]], ...] = (
    ("hit rate (tokens)", "hit_rate", pct), ("cached tokens", "cached_tokens", num),
    ("false-hit tokens", "false_hit_tokens", num),
    ("avoidable tokens", "avoidable_tokens", num), ("prefill tokens", "prefill_tokens", num),
    ("load spread (max/mean)", "spread", ratio))


def _err(name: str, value: float | None, fmt: Callable[[float | None], str]) -> str:
    if value is None:
        return ""
    if name == "hit_rate":
        return f" ±{abs(100 * value):.1f}pt"
    return f" ±{fmt(abs(value))}"


def _column(f: Figures, err: dict[str, float | None] | None) -> list[str]:
    return [fmt(getattr(f, name)) + ("" if err is None else _err(name, err.get(name), fmt))
            for _, name, fmt in ROWS]


def headers(c: Comparison) -> list[str]:
    return ["", "recorded", "baseline", *[s.run.scenario.label for s in c.scenarios]]


def figure_rows(c: Comparison) -> list[list[str]]:
    """One row per figure: its name, then the recording, the baseline and each scenario."""
    figs = [c.measured, c.baseline.total, *(s.total for s in c.scenarios)]
    cols = [_column(c.measured, None), _column(c.baseline.total, c.error),
            *[_column(s.total, c.error) for s in c.scenarios]]
    rows = [[label, *(col[i] for col in cols)] for i, (label, _, _) in enumerate(ROWS)]
    rows.append(["saving vs recorded (prefill tokens)", "", num(c.baseline.saving_tokens),
                 *[num(s.saving_tokens) for s in c.scenarios]])
    for k in sorted({k for f in figs for k, v in f.verdicts.items() if v}):
        rows.append([f"verdict {k}", *(str(f.verdicts.get(k, 0)) for f in figs)])
    return rows


def minute_rows(c: Comparison) -> list[list[str]]:
    """Per minute of the window: its start (UTC), the recorded hit rate, then the
    baseline's and each scenario's."""
    reports = [c.baseline, *c.scenarios]
    out = []
    for m, f in c.measured_minutes.items():
        out.append([datetime.fromtimestamp(m, UTC).strftime("%H:%M"), pct(f.hit_rate),
                    *[pct(r.minutes[m].hit_rate) if m in r.minutes else "—"
                      for r in reports]])
    return out


def minute_series(c: Comparison) -> dict[str, list[tuple[float, float]]]:
    """Hit rate per minute, per line (recorded, baseline, each scenario), for a chart."""
    out = {"recorded": [(m, f.hit_rate) for m, f in c.measured_minutes.items()
                        if f.hit_rate is not None]}
    for r in [c.baseline, *c.scenarios]:
        out[r.run.scenario.label] = [(m, f.hit_rate) for m, f in r.minutes.items()
                                     if f.hit_rate is not None]
    return out


def aligned(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in [head, *rows]]
