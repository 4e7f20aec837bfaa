"""The browser head start names chunks the installed Streamlit has (a renamed element kind
would otherwise silently lose it)."""

from __future__ import annotations

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
