"""The browser head start names chunks the installed Streamlit has (a renamed element kind
would otherwise silently lose it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mmlens.ui import warmup


def test_every_named_chunk_is_in_the_installed_frontend() -> None:
    files = warmup.chunk_files()
    assert [f.split(".")[0] for f in files] == list(warmup.CHUNKS)
    js = Path(warmup.st.__file__).parent / "static" / "static" / "js"
    assert all((js / f).stat().st_size > 1000 for f in files)


def test_a_missing_kind_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "Metric.x.js").write_text("export {}")
    warmup.chunk_files.cache_clear()
    try:
        assert warmup.chunk_files(tmp_path) == ()  # no Plotly chunk: nothing to load ahead
        (tmp_path / "PlotlyChart.abc123.js").write_text("export {}")
        warmup.chunk_files.cache_clear()
        assert warmup.chunk_files(tmp_path) == ("PlotlyChart.abc123.js",)
    finally:
        warmup.chunk_files.cache_clear()


def test_the_server_imports_the_emoji_catalog_when_it_starts() -> None:
    """Serving the app (serve.py) imports Streamlit's emoji catalog, which a session's first
    alert with non-ASCII text would otherwise import (and compile its regex) on a click."""
    root = Path(__file__).resolve().parents[2]
    probe = ("import sys; import serve; "
             "print('streamlit.emojis' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "True"
