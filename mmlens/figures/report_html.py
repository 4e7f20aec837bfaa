"""A self-contained HTML report of scenario results (plotly.js inlined once)."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence

import plotly.graph_objects as go

from mmlens.analysis.scenarios import Result

COLORS = {"pass": "#1a7f37", "fail": "#cf222e", "inconclusive": "#9a6700"}


def tokens_figure(result: Result) -> go.Figure:
    rows = [r for r in result.requests if "label" in r]
    labels = [r["label"] for r in rows]
    fig = go.Figure()
    fig.add_bar(name="prompt tokens", x=labels, y=[r.get("prompt_tokens") or 0 for r in rows],
                marker_color="#8c959f")
    fig.add_bar(name="cached tokens", x=labels, y=[r.get("cached_tokens") or 0 for r in rows],
                marker_color=COLORS["pass"],
                text=[r.get("worker") or "" for r in rows], textposition="outside")
    fig.update_layout(barmode="overlay", height=280, margin=dict(l=40, r=10, t=30, b=40),
                      title=f"{result.name}: tokens per request (bar text: worker)")
    return fig


def render(results: Sequence[Result], title: str, meta: dict[str, str]) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2rem;max-width:1100px}"
        "td,th{padding:.25rem .6rem;border-bottom:1px solid #ddd;text-align:left;"
        "font-size:.9rem}pre{background:#f6f8fa;padding:.6rem;overflow:auto}"
        ".v{font-weight:600;padding:.1rem .5rem;border-radius:.3rem;color:#fff}</style>",
        "</head><body>", f"<h1>{html.escape(title)}</h1><table>",
    ]
    parts += [f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
              for k, v in meta.items()]
    parts.append("</table><h2>Verdicts</h2><table><tr><th>scenario</th><th>verdict</th>"
                 "<th>summary</th></tr>")
    for r in results:
        parts.append(f"<tr><td><a href='#{r.name}'>{r.name}</a></td><td><span class='v' "
                     f"style='background:{COLORS[r.verdict]}'>{r.verdict}</span></td>"
                     f"<td>{html.escape(r.summary)}</td></tr>")
    parts.append("</table>")
    include_js: str | bool = "inline"
    for r in results:
        parts.append(f"<h2 id='{r.name}'>{r.name} — {r.verdict}</h2>"
                     f"<p>{html.escape(r.summary)}</p>")
        parts.append(tokens_figure(r).to_html(full_html=False, include_plotlyjs=include_js))
        include_js = False
        cols = ["label", "worker", "prompt_tokens", "cached_tokens",
                "predicted_overlap_blocks", "ttft_s", "error_code", "explanation"]
        parts.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>")
        for row in r.requests:
            if "label" in row:
                parts.append("<tr>" + "".join(
                    f"<td>{html.escape(str(row.get(c, '')))}</td>" for c in cols) + "</tr>")
        parts.append("</table><h3>Evidence</h3><pre>"
                     + html.escape(json.dumps(r.evidence, indent=1, default=str)) + "</pre>")
    parts.append("</body></html>")
    return "".join(parts)
