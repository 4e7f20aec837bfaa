"""A page test fails when page_guard turned an exception into an error box, unless the test
declared that it expects one (expect_caught)."""

from __future__ import annotations

import pytest
import streamlit as st
from mmlens.ui.shared import CAUGHT_KEEP
from streamlit.testing.v1 import AppTest

from tests.pages.apptest_util import (
    CaughtByPageGuard,
    assert_clean,
    caught,
    expect_caught,
    messages,
    open_page,
)
from tests.pages.recorded_store import Recorded


def _planted(*_args: object, **_kwargs: object) -> None:
    raise RuntimeError("planted failure")


def _guarded_script() -> None:
    import streamlit as st
    from mmlens.ui.shared import page_guard

    for i in range(st.session_state.get("failures", 2)):
        with page_guard(f"Part {i}"):
            raise KeyError(f"k{i}") if i % 2 == 0 else RuntimeError(f"boom {i}")
    st.write("rendered")


def test_a_page_whose_guard_caught_an_exception_fails_its_test(db: Recorded,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                ) -> None:
    monkeypatch.setattr(st, "subheader", _planted)  # called inside the Overview's guard
    with pytest.raises(CaughtByPageGuard, match="Overview: RuntimeError: planted failure"):
        open_page("overview")


def test_an_expected_caught_exception_passes_and_is_named(db: Recorded,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           ) -> None:
    monkeypatch.setattr(st, "subheader", _planted)
    with expect_caught() as got:
        at = open_page("overview")
    assert_clean(at)  # no traceback: the error box is all the user sees
    assert "Overview failed: RuntimeError: planted failure" in messages(at)["error"]
    # open_page runs the app at / (the Overview) and then the Overview page itself
    assert got == ["Overview: RuntimeError: planted failure"] * 2


def test_the_same_page_without_the_fault_passes(db: Recorded) -> None:
    at = open_page("overview")
    assert_clean(at)
    assert caught(at) == []


def test_expect_caught_fails_when_nothing_was_caught(db: Recorded) -> None:
    with pytest.raises(AssertionError, match="caught nothing"), expect_caught():
        open_page("overview")


def test_page_guard_records_each_caught_exception_per_run() -> None:
    at = AppTest.from_function(_guarded_script)
    with expect_caught() as got:
        at.run()
    assert got == ["Part 0: KeyError: 'k0'", "Part 1: RuntimeError: boom 1"]
    assert [e.value for e in at.error] == ["Part 0: 'k0'", "Part 1 failed: RuntimeError: boom 1"]
    at.session_state["failures"] = 0
    at.run()  # a clean rerun of the same session does not fail on the earlier run's record
    assert caught(at) == [] and not at.error
    at.session_state["failures"] = 1
    with pytest.raises(CaughtByPageGuard, match="Part 0: KeyError"):
        at.run()


def test_a_long_session_keeps_only_the_last_records() -> None:
    at = AppTest.from_function(_guarded_script)
    at.session_state["failures"] = CAUGHT_KEEP + 5
    with expect_caught() as got:
        at.run()
    assert len(got) == CAUGHT_KEEP
    assert got[-1] == f"Part {CAUGHT_KEEP + 4}: KeyError: 'k{CAUGHT_KEEP + 4}'"
