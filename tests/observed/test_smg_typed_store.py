"""The SMG captures stored through the typed fast paths (``smg_typed`` in Python, and the
compiled reader where it is built) and through the whole-object reference path give the very
same rows: every decision, trace and trace key,
and the same counts of the lines set aside."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mmlens.collectors.observed_sink import ObservedSink

from mmlens.ingest import smg_typed
from mmlens.ingest.observed_logs import Attempts, read_lines
from mmlens.store.sqlite import Store
from tests.fixtures_path import CAPTURES

CAPTURE_LOGS = sorted(CAPTURES.glob("smg_1.13_*log.jsonl"))
# Lines a log may hold beside the router's own: each must be set aside (counted) or read
# exactly as the reference reads it.
ODD = ['{"timestamp":"2026-12-01 03:05:22","message":"Cache routing dispatch","span":{',
       '{"message":"Event-driven routing","worker":["w"],"span":{"request_id":"chatcmpl-x",'
       '"path":"/v1/chat/completions"}}',
       '{"message":"Cache routing dispatch","evidence":"{\\"selections\\":[1]}",'
       '"span":{"request_id":7,"path":"/generate"}}',
       '{"message":"finished processing request","span":{"request_id":"chatcmpl-x",'
       '"path":"/v1/chat/completions","status_code":"500","latency":"12"}}',
       '{"message":"Event-driven routing","span":{"request_id":"\ud800","path":"/generate"}}',
       "[1, 2]", "not json at all request_id=r9"]


def _stored(tmp: Path, lines: list[str], chunk: int) -> tuple[dict[str, list[Any]],
                                                               dict[str, int]]:
    store = Store(tmp / "x.db")
    sink = ObservedSink(store.add_traces, store.add_decisions, hold_s=0.0)
    errors: dict[str, int] = {}
    attempts = Attempts()
    for i in range(0, len(lines), chunk):  # as the collector reads a growing log
        decisions, frags = read_lines(lines[i:i + chunk], errors, attempts, first_seq=i)
        for d in decisions:
            if d.ts is None:
                d.ts = 1.0
        store.add_decisions(decisions)
        sink.add(frags)
        sink.flush(force=True)
    rows = {table: [tuple(r) for r in store.db.execute(
        f"SELECT * FROM {table} ORDER BY {order}")]
        for table, order in (("decisions", "rowid"), ("traces", "rowid"),
                             ("trace_keys", "key"))}
    store.close()
    return rows, errors


PATHS = ["typed"] + (["native"] if smg_typed.NATIVE is not None else [])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("log", CAPTURE_LOGS, ids=lambda p: p.name)
@pytest.mark.parametrize("chunk", [7, 1000])
def test_typed_and_reference_paths_store_the_same_rows(tmp_path: Path, log: Path,
                                                       chunk: int, path: str) -> None:
    lines = log.read_text().splitlines()
    lines = lines[: len(lines) // 2] + ODD + lines[len(lines) // 2:]
    assert any(smg_typed.typed_line(line) is not None for line in lines)
    (tmp_path / "fast").mkdir()
    (tmp_path / "ref").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(smg_typed, "PATH", path)
        fast = _stored(tmp_path / "fast", lines, chunk)
        mp.setattr(smg_typed, "PATH", "whole")
        ref = _stored(tmp_path / "ref", lines, chunk)
    assert fast[0]["decisions"], "the capture stores decisions"
    assert fast == ref
    assert fast[1].get("malformed_log_line", 0) >= 2  # each odd line counted, one by one
