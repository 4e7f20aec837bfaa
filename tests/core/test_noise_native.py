"""The compiled noise filter of router-log lines (``mmlens/ingest/_lines.c``) keeps exactly
the lines the regex ``observed_logs.NOISE`` finds nothing in: random lines built around the
key and the noise messages, ASCII or not, side by side."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmlens.ingest import observed_logs
from mmlens.ingest.observed_logs import NOISE, NOISE_KEY, NOISE_MESSAGES, kept_lines

native = pytest.importorskip("mmlens.ingest._lines")
PIECES = st.sampled_from([NOISE_KEY, '"message": "', '\\"message\\":\\"', '"', "message",
                          *NOISE_MESSAGES, *(m[:-1] for m in NOISE_MESSAGES),
                          "Event-driven routing", "é", "\u2603", "x", ",", "{", "\n"])
LINES = st.lists(st.lists(PIECES | st.text(max_size=3), max_size=8).map("".join), max_size=20)


def regex(lines: list[str], first: int) -> list[tuple[int, str]]:
    return [(n, line) for n, line in enumerate(lines, first) if not NOISE.search(line)]


@settings(max_examples=400, deadline=None)
@given(lines=LINES, first=st.integers(0, 1 << 40))
def test_compiled_filter_keeps_what_the_regex_keeps(lines: list[str], first: int) -> None:
    found = native.kept(lines, first, *observed_logs._NOISE_BYTES)
    if found is None:  # a line without UTF-8 form: the regex reads the batch
        assert any(not line.isascii() for line in lines)
        return
    assert found == regex(lines, first)
    assert kept_lines(lines, first) == found


@pytest.mark.parametrize("line", [
    '"message":"message":"Token bucket"',  # the second key starts at the first one's quote
    '"message":"x","fields":{"message":"Acquired token"}', '"message":"Token bucke',
    '"message":"', 'Token bucket', '"message": "Token bucket"'])
def test_every_occurrence_of_the_key_counts(line: str) -> None:
    assert native.kept([line], 0, *observed_logs._NOISE_BYTES) == regex([line], 0)


def test_a_line_without_utf8_form_falls_back_to_the_regex() -> None:
    lines = ['{"message":"Token bucket"}', '{"message":"\ud800 Event-driven routing"}',
             '{"message":"Event-driven routing"}']
    assert native.kept(lines, 0, *observed_logs._NOISE_BYTES) is None
    assert kept_lines(lines, 5) == regex(lines, 5) == [(6, lines[1]), (7, lines[2])]


def test_the_smg_capture_keeps_its_routing_lines() -> None:
    from tests.fixtures_path import CAPTURES

    lines = (CAPTURES / "smg_1.13_observed_log.jsonl").read_text().splitlines()
    kept = kept_lines(lines)
    assert kept == regex(lines, 0)
    assert len(lines) // 3 < len(kept) < len(lines)  # the capture's noise is skipped
