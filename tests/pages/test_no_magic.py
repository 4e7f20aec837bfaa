"""Streamlit's "magic" (a bare expression written to the page) is off for the dashboard: it
rewrote each page's syntax tree on its first run. So no page may rely on it: an expression
statement that is not a call or a docstring would silently draw nothing."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*REPO.joinpath("pages").glob("*.py"), REPO / "app.py"])


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)):
            out.add(id(body[0]))
    return out


def bare_expressions(source: str) -> list[int]:
    """Lines of expression statements magic would have drawn (not calls, awaits, yields or
    docstrings)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and id(node) not in docs
            and not isinstance(node.value, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom))]


def test_the_check_finds_what_magic_would_draw() -> None:
    assert bare_expressions('"""doc"""\nimport streamlit as st\nx = 1\nx\n"shown"\nst.write(x)\n'
                            ) == [4, 5]


def test_no_page_relies_on_magic() -> None:
    assert SCRIPTS and all(p.exists() for p in SCRIPTS)
    found = {p.name: lines for p in SCRIPTS if (lines := bare_expressions(p.read_text()))}
    assert found == {}


def test_magic_is_off_in_the_dashboards_config() -> None:
    config = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())
    assert config["runner"]["magicEnabled"] is False
    dashboard = (REPO / "mmlens" / "cli" / "dashboard.py").read_text()
    assert '"--runner.magicEnabled", "false"' in dashboard


def test_no_full_collection_after_each_script_run() -> None:
    """Streamlit's post-run ``gc.collect(2)`` holds the GIL (240-490 ms on a fleet store's
    heap), so the dashboard turns it off wherever it is started from."""
    config = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())
    assert config["runner"]["postScriptGC"] is False
    dashboard = (REPO / "mmlens" / "cli" / "dashboard.py").read_text()
    assert '"--runner.postScriptGC", "false"' in dashboard
