"""The About page's vocabulary and token-layout picture, and the one time range and refresh
control every page shares (AppTest on the app's entry point, no store needed)."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from tests.pages.apptest_util import APP, assert_clean, figure_titled, open_page


@pytest.fixture(autouse=True)
def no_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MMLENS_DB", raising=False)
    monkeypatch.delenv("MMLENS_CONFIG", raising=False)


def test_about_explains_the_vocabulary_with_a_request_layout() -> None:
    at = open_page("home")
    assert_clean(at)
    fig = figure_titled(at, "qwen3-vl: 640x480 + text")
    rows = {t.get("y", [None])[0] for t in fig["data"] if t.get("y")}
    assert any(str(r).startswith("router view") for r in rows), rows
    # The router view's image run: 300 tokens for 640x480 on Qwen3-VL (32-pixel patches).
    image = [t for t in fig["data"] if str(t.get("name", "")).startswith("image 0")]
    assert image and sum(image[0]["x"]) >= 300
    terms = set(at.table[0].value.index)
    for word in ("anchor view", "router view", "false hit", "better worker", "index gauge",
                 "event index overlap", "images keyed", "seed"):
        assert word in terms, word


def test_one_time_range_and_refresh_hold_from_page_to_page() -> None:
    fresh = open_page("lab")  # only the sidebar's widgets give these keys their defaults
    assert (fresh.session_state["time_window"], fresh.session_state["refresh_s"]) == (900, 5)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.session_state["time_window"] = 3600  # as the sidebar's widgets set them
    at.session_state["refresh_s"] = 0
    at.run()
    for page in ("cache", "routing", "overview"):
        at.switch_page(f"pages/{page}.py").run()
        assert_clean(at)
        # The entry point draws the controls on every page: the choice is not reset.
        assert (at.session_state["time_window"], at.session_state["refresh_s"]) == (3600, 0)
