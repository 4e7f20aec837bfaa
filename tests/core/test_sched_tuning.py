"""The tap proxy's short time slice: asked of the kernel for one thread, seen in /proc, and
given back."""

from __future__ import annotations

import platform
import re
import threading

import pytest

from mmlens.cli.sched_tuning import SLICE_NS, set_slice, slice_ns

CUSTOM_SLICES = platform.system() == "Linux" and tuple(
    int(x) for x in re.findall(r"\d+", platform.release())[:2]) >= (6, 12)


@pytest.mark.skipif(not CUSTOM_SLICES, reason="a thread's own slice: Linux 6.12 and later")
def test_a_thread_gets_the_slice_it_asks_for_and_the_default_back() -> None:
    got: dict[str, int | None] = {}

    def thread() -> None:  # its own thread: the test process keeps its slice
        got["default"] = slice_ns()
        assert set_slice(SLICE_NS)
        got["short"] = slice_ns()
        assert set_slice(0)
        got["back"] = slice_ns()

    t = threading.Thread(target=thread)
    t.start()
    t.join()
    assert got["short"] == SLICE_NS
    assert got["default"] is not None and got["default"] > SLICE_NS
    assert got["back"] == got["default"]
