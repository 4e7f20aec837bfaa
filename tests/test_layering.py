"""The layering the README promises, checked over the import graph of the source tree.

Every `import` and `from … import` is read from the AST of each module (also those inside
functions, and `importlib.import_module("…")` / `__import__("…")` with a literal name), relative
imports are resolved, and the top-level folders get their installed names (collectors/ →
mmlens.collectors, demo/ → mmlens.demo, pages/ → mmlens.ui). The pure packages are checked
through every mmlens module they reach, so a helper in the root cannot carry a forbidden
import in for them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# folder (relative to the repo) → the package name it installs as
PACKAGE_DIRS = {"mmlens": "mmlens", "collectors": "mmlens.collectors", "demo": "mmlens.demo",
                "pages": "mmlens.ui"}
SCRIPTS = {"app.py": "app", "serve.py": "serve"}  # Streamlit's entry scripts, not importable
# as package modules

PURE = ("mmlens.layout", "mmlens.ingest", "mmlens.analysis", "mmlens.figures", "mmlens.export",
        "mmlens.whatif", "mmlens.replay")
FORBIDDEN_IN_PURE_EXTERNAL = (
    # network
    "httpx", "requests", "socket", "urllib.request", "http.client", "http.server", "aiohttp",
    "grpc",
    # processes
    "subprocess", "multiprocessing", "signal",
    # UI, messaging, storage
    "streamlit", "zmq", "sqlite3", "psycopg",
)
SQL_DRIVERS = ("sqlite3", "psycopg")  # only mmlens.store talks to a database
FORBIDDEN_IN_PURE_INTERNAL = ("mmlens.store", "mmlens.collectors", "mmlens.demo", "mmlens.ui",
                              "mmlens.cli")
DEMO_IMPORTERS_ALLOWED = {"mmlens.cli.main"}  # the `mmlens demo` dispatch
UI_COLLECTORS_ALLOWED = {"mmlens.collectors.sender"}
OLD_TOP_LEVEL = ("collectors", "demo", "pages")


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    where: str  # path:line, for the failure message

    def __str__(self) -> str:
        return f"{self.where}: {self.importer} imports {self.imported}"


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def module_files(root: Path) -> dict[str, Path]:
    """Installed module name → file, for every module of the source tree under `root`."""
    found: dict[str, Path] = {}
    for folder, package in PACKAGE_DIRS.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    for script, name in SCRIPTS.items():
        if (root / script).exists():
            found[name] = root / script
    return found


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = _package_of(module, path).split(".")
    if node.level - 1 > len(package) - 1:
        raise ValueError(f"{path}:{node.lineno}: relative import beyond the top package")
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _literal_dynamic_import(node: ast.Call) -> str | None:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in {"import_module", "__import__"} or not node.args:
        return None
    arg = node.args[0]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def imports_of(module: str, path: Path, known: Iterable[str]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in the file, at any depth. `from P import n`
    names P.n when that is a module of ours (a submodule import), else P; for other packages
    both P and P.n (so `from http import client` is seen as http.client)."""
    known = set(known)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, path, node)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in known:
                    yield sub, node.lineno
                    continue
                yield source, node.lineno
                if not under(source, "mmlens") and alias.name != "*":
                    yield sub, node.lineno
        elif isinstance(node, ast.Call):
            name = _literal_dynamic_import(node)
            if name:
                yield name, node.lineno


def import_graph(root: Path) -> list[Edge]:
    files = module_files(root)
    edges = []
    for module, path in files.items():
        rel = path.relative_to(root)
        for imported, line in imports_of(module, path, files):
            edges.append(Edge(module, imported, f"{rel}:{line}"))
    return edges


def _reach(start: str, by_importer: dict[str, list[Edge]], known: set[str]) -> Iterator[
        tuple[Edge, list[str]]]:
    """Every import edge reachable from `start` through modules of ours, with the chain."""
    seen = {start}
    stack = [(start, [start])]
    while stack:
        module, chain = stack.pop()
        for edge in by_importer.get(module, []):
            yield edge, chain
            for target in _ours(edge.imported, known):
                if target not in seen:
                    seen.add(target)
                    stack.append((target, [*chain, target]))


def _ours(name: str, known: set[str]) -> list[str]:
    """The modules of ours that importing `name` executes (its parent packages too)."""
    parts = name.split(".")
    return [m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if m in known]


def pure_violations(root: Path) -> list[str]:
    edges = import_graph(root)
    known = set(module_files(root))
    by_importer: dict[str, list[Edge]] = {}
    for edge in edges:
        by_importer.setdefault(edge.importer, []).append(edge)
    out = set()
    for start in sorted(m for m in known if any(under(m, p) for p in PURE)):
        for edge, chain in _reach(start, by_importer, known):
            bad = [f for f in FORBIDDEN_IN_PURE_EXTERNAL + FORBIDDEN_IN_PURE_INTERNAL
                   if under(edge.imported, f)]
            if bad:
                via = f" (reached from {' → '.join(chain)})" if len(chain) > 1 else ""
                out.add(f"{edge}{via}")
    return sorted(out)


def sql_violations(root: Path) -> list[str]:
    return sorted(str(e) for e in import_graph(root)
                  if any(under(e.imported, d) for d in SQL_DRIVERS)
                  and not under(e.importer, "mmlens.store"))


def demo_violations(root: Path) -> list[str]:
    return sorted(str(e) for e in import_graph(root)
                  if under(e.imported, "mmlens.demo") and not under(e.importer, "mmlens.demo")
                  and e.importer not in DEMO_IMPORTERS_ALLOWED)


def ui_violations(root: Path) -> list[str]:
    return sorted(str(e) for e in import_graph(root)
                  if (under(e.importer, "mmlens.ui") or e.importer in ("app", "serve"))
                  and under(e.imported, "mmlens.collectors")
                  and e.imported not in UI_COLLECTORS_ALLOWED)


def old_name_violations(root: Path, extra: Iterable[Path] = ()) -> list[str]:
    """Imports of collectors/demo/pages as top-level packages (they would load a second copy
    of the module under another name) — in the package tree and in `extra` files."""
    edges = import_graph(root)
    for path in extra:
        rel = path.relative_to(root)
        edges += [Edge(str(rel), name, f"{rel}:{line}")
                  for name, line in imports_of(str(rel), path, ())]
    return sorted(str(e) for e in edges if any(under(e.imported, o) for o in OLD_TOP_LEVEL))


def _outside_tree() -> list[Path]:
    """tests/, benchmarks/ and scripts: they import the package by its installed names too."""
    return [p for d in ("tests", "benchmarks", "scripts") for p in sorted((REPO / d).rglob("*.py"))]


# --- the rules, on the real tree ---------------------------------------------------------------


def test_the_graph_covers_the_tree() -> None:
    files = module_files(REPO)
    for expected in ("mmlens.layout.hashing", "mmlens.ingest.kv_events", "mmlens.cli.main",
                     "mmlens.collectors.runner", "mmlens.demo.cli", "mmlens.ui.shared", "app"):
        assert expected in files
    edges = {(e.importer, e.imported) for e in import_graph(REPO)}
    # a function-level import, and a relative-free import of a renamed folder
    assert ("mmlens.cli.main", "mmlens.demo.cli") in edges
    assert ("app", "mmlens.ui.shared") in edges
    assert ("serve", "mmlens.ui.root_base") in edges
    assert len(edges) > 3 * len(files)


# Known edges another change removes; each is checked to be gone by its own xfail test, so
# the rule above stays strict for everything else.
def test_pure_packages_import_no_io() -> None:
    assert pure_violations(REPO) == []


def test_sql_stays_inside_the_store() -> None:
    assert sql_violations(REPO) == []


def test_only_the_demo_command_imports_the_demo() -> None:
    assert demo_violations(REPO) == []


def test_pages_reach_collectors_only_through_the_sender() -> None:
    assert ui_violations(REPO) == []


def test_nothing_imports_the_old_top_level_names() -> None:
    assert old_name_violations(REPO, _outside_tree()) == []


# --- the checker itself can fail ---------------------------------------------------------------


def _plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in PACKAGE_DIRS:
        (root / folder).mkdir(exist_ok=True)
        (root / folder / "__init__.py").touch()
    return root


def test_checker_catches_planted_violations(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "mmlens/layout/__init__.py": "",
        "mmlens/layout/ok.py": "import math\nfrom urllib import parse\n",
        # a function-level, relative import of a root helper that opens a socket
        "mmlens/layout/sneaky.py": "def f():\n    from .. import helper\n    return helper\n",
        "mmlens/helper.py": "from http import client\n",
        "mmlens/ingest/__init__.py": "",
        "mmlens/ingest/direct.py": "import importlib\nimportlib.import_module('zmq')\n",
        "mmlens/analysis/__init__.py": "from mmlens.store import reader\n",
        "mmlens/store/__init__.py": "",
        "mmlens/store/reader.py": "import sqlite3\n",
        "mmlens/cli/__init__.py": "",
        "mmlens/cli/main.py": "from mmlens.demo import cli\n",
        "mmlens/cli/other.py": "def g():\n    import mmlens.demo.engine\n",
        "demo/cli.py": "from . import engine\n",
        "demo/engine.py": "",
        "pages/lab.py": "from mmlens.collectors import sender, lab\n",
        "pages/ok.py": "from mmlens.collectors.sender import send\n",
        "collectors/sender.py": "def send(): ...\n",
        "collectors/lab.py": "",
        "collectors/raw.py": "def h():\n    import psycopg\n",
        "app.py": "import pages.shared\n",
    })
    pure = pure_violations(root)
    assert any(v.startswith("mmlens/helper.py:1: mmlens.helper imports http.client (reached "
                            "from mmlens.layout.sneaky → mmlens.helper)") for v in pure)
    assert any("direct.py:2" in v and "zmq" in v for v in pure)
    assert any("mmlens.analysis imports mmlens.store.reader" in v for v in pure)
    assert not any("ok.py" in v for v in pure)
    assert demo_violations(root) == ["mmlens/cli/other.py:2: mmlens.cli.other imports "
                                     "mmlens.demo.engine"]
    assert ui_violations(root) == ["pages/lab.py:1: mmlens.ui.lab imports mmlens.collectors.lab"]
    assert old_name_violations(root) == ["app.py:1: app imports pages.shared"]
    assert sql_violations(root) == ["collectors/raw.py:2: mmlens.collectors.raw imports psycopg"]


def test_relative_imports_resolve_against_the_installed_names(tmp_path: Path) -> None:
    root = _plant(tmp_path, {"pages/inspector.py": "from .shared import x\nfrom . import lab\n",
                             "pages/shared.py": "", "pages/lab.py": "",
                             "collectors/deep/__init__.py": "from ..traces import y\n",
                             "collectors/traces.py": ""})
    edges = {(e.importer, e.imported) for e in import_graph(root)}
    assert ("mmlens.ui.inspector", "mmlens.ui.shared") in edges
    assert ("mmlens.ui.inspector", "mmlens.ui.lab") in edges
    assert ("mmlens.collectors.deep", "mmlens.collectors.traces") in edges
