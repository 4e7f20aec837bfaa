"""Formatting the pages share."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from mmlens.analysis.judgement.vocabulary import MISSES


def clock(ts: float | None) -> str:
    """``HH:MM:SS`` (UTC), or "—"."""
    return "—" if ts is None else time.strftime("%H:%M:%S", time.gmtime(ts))


def short_worker(url: str | None) -> str:
    """A worker URL without its scheme (``grpc://127.0.0.1:50051`` → ``127.0.0.1:50051``)."""
    if not url:
        return "—"
    return url.split("://", 1)[-1]


def pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.0%}"


def worker_names(targets: Mapping[str, Any] | None) -> dict[str, str]:
    """The config's name for each worker (``w1``), keyed by what routers, KV events and
    metrics call it: its router URL, with and without the scheme."""
    out: dict[str, str] = {}
    for w in (targets or {}).get("workers") or []:
        name, url = w.get("name"), w.get("router_url")
        if name and url and name != url:
            out[str(url)] = str(name)
            out[short_worker(str(url))] = str(name)
    return out


def router_names(targets: Mapping[str, Any] | None) -> dict[str, str]:
    """The config's name for each router, keyed by its URL."""
    return {str(r["url"]): str(r["name"]) for r in (targets or {}).get("routers") or []
            if r.get("url") and r.get("name")}


def worker_label(worker: str | None, names: Mapping[str, str] | None = None) -> str:
    """The config's name of a worker when it has one, else its URL without the scheme; a DP
    rank suffix (``#1``) is kept."""
    if not worker:
        return "—"
    base, sep, rank = str(worker).partition("#")
    name = (names or {}).get(base) or short_worker(base)
    return f"{name}#{rank}" if sep and rank not in ("", "0") else name


def name_rows(rows: Sequence[dict[str, Any]], names: Mapping[str, str], key: str = "worker",
              ) -> list[dict[str, Any]]:
    """Rows whose ``key`` names a worker by URL, with the config's name in its place and the
    address kept in an ``address`` column after it."""
    out = []
    for row in rows:
        url = row.get(key)
        if not isinstance(url, str) or not url:
            out.append(dict(row))
            continue
        label = worker_label(url, names)
        new: dict[str, Any] = {}
        for k, v in row.items():
            new[k] = label if k == key else v
            if k == key:
                new["address"] = short_worker(url)
        out.append(new)
    return out


def named_text(text: str, names: Mapping[str, str]) -> str:
    """``text`` with every worker address it mentions (with or without its scheme, and a DP
    rank 0 suffix) replaced by the worker's config name."""
    for addr in sorted(names, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.:/-]){re.escape(addr)}(#0)?(?![\w])", names[addr], text)
    return text


def named_headline(text: str, worker: str | None, names: Mapping[str, str] | None) -> str:
    """A verdict's sentence with the worker's URL replaced by its config name."""
    if not worker or not names:
        return text
    label = worker_label(worker, names)
    return text if label == short_worker(worker) else text.replace(worker, label)


# Verdicts that are a cache miss of some kind ("cold" too: nothing was reused), and the row
# colour each gets wherever requests are listed.
# Misses in the order the pages list them (the vocabulary's, and the request failures).
MISS_VERDICTS = ("false_hit", "count_drift", "fallback", "evicted", "spilled", "cold",
                 *sorted(MISSES - {"false_hit", "count_drift", "fallback", "evicted",
                                   "spilled", "cold"}), "error")
VERDICT_COLOURS = {
    "false_hit": "#fde2e1", "count_drift": "#fde2e1", "fallback": "#fde2e1",
    "evicted": "#fde2e1", "error": "#fde2e1", "spilled": "#fff1d6", "cold": "#e8eef5",
    "hit": "#e3f6ea", "events_blind": "#fff1d6", "unexplained": "#fde2e1",
    "hit_or_false_hit": "#f3ecf9", "hit_or_spilled": "#f3ecf9",
    "hit_or_cold": "#f3ecf9",
}


def is_miss(verdict: str | None) -> bool:
    return verdict in MISS_VERDICTS


def verdict_css(verdict: str | None) -> str:
    """A row's background for its verdict ("" when unmarked)."""
    colour = VERDICT_COLOURS.get(verdict or "")
    return f"background-color: {colour}" if colour else ""


def verdict_counts(verdicts: Sequence[str]) -> str:
    """``3 misses of 14 (false_hit 2, cold 1)``."""
    misses = [v for v in verdicts if is_miss(v)]
    by = {v: misses.count(v) for v in MISS_VERDICTS if v in misses}
    detail = ", ".join(f"{k} {n}" for k, n in by.items())
    return f"{len(misses)} miss(es) of {len(verdicts)}" + (f" ({detail})" if detail else "")


def by_worker_name(rows: Sequence[dict[str, Any]], key: str = "worker") -> list[dict[str, Any]]:
    """Rows in their workers' name order, numbers compared as numbers (w2 before w10), per
    router where rows carry one; Dynamo's own order (lease ids) means nothing to a user."""
    def order(row: dict[str, Any]) -> tuple[str, list[Any]]:
        parts = re.split(r"(\d+)", str(row.get(key) or ""))
        return (str(row.get("router") or ""),
                [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts])
    return sorted(rows, key=order)


# Markdown characters a cell could start by accident (Streamlit's markdown also reads $…$ as
# LaTeX), escaped so a cell reads as written.
_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]<>|$"} | {"\n": " "})


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """``rows`` (their first row's keys as columns) as a Markdown table: drawn by the element
    every page already loaded, where a table or JSON element costs a new tab seconds of
    JavaScript the first time one is shown."""
    if not rows:
        return ""
    cols = list(rows[0])

    def cell(v: Any) -> str:
        return "—" if v is None else str(v).translate(_MD_SPECIAL)

    lines = ["| " + " | ".join(cell(c) or " " for c in cols) + " |",
             "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
