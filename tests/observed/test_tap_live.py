"""`mmlens tap` in front of the real routers: the malformed cases a hostile client sends get
the same answer through the tap as from SMG 1.13 directly, and on the real Dynamo 1.6.1
frontend `--dynamo-worker-id` records the worker that served each request while the client
gets the answer it would have had without the tap (streamed and not)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.live_support import REPO, free_port, free_port_base, stop_process, wait_until
from tests.observed.external import MODEL, dynamo_cluster, smg_cluster

pytestmark = [pytest.mark.live, pytest.mark.slow]

DEEP = "[" * 3000 + "]" * 3000
# Fields a router makes anew for every answer: masked before two answers are compared.
FRESH = re.compile(rb'"(id|created|request_received_ms)":\s*("[^"]*"|\d+)')
CHAT = "/v1/chat/completions"


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 4, "temperature": 0, "messages": [
        {"role": "user", "content": "Say hello"}], **extra}


MALFORMED: list[tuple[str, bytes]] = [
    ("nested 3,000 deep", json.dumps(chat()).encode()[:-1] + b', "x": ' + DEEP.encode() + b"}"),
    ("image URL with a \\udc80 escape", json.dumps(chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/PLACE.png"}},
        {"type": "text", "text": "what"}]}])).encode().replace(b"PLACE", b"\\udc80")),
    ("model \\udc80", json.dumps(chat(model="PLACE")).encode().replace(b"PLACE", b"\\udc80")),
    ("not JSON", b'{"model": '),
    ("choices a number", json.dumps(chat(messages=5)).encode()),
    ("a plain request", json.dumps(chat()).encode()),
    ("a plain stream", json.dumps(chat(stream=True)).encode()),
]


@contextlib.contextmanager
def tap(upstream: str, db: Path, *extra: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mmlens", "tap", "--listen",
                             f"127.0.0.1:{port}", "--upstream", upstream, "--db", str(db),
                             *extra], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(url + "/v1/models", timeout=1).status_code == 200, 30,
                   what="tap", ignore=(httpx.HTTPError,))
        yield url
    finally:
        stop_process(proc, signal.SIGINT, 30)


def post(c: httpx.Client, base: str, body: bytes, rid: str) -> tuple[int, bytes]:
    r = c.post(base + CHAT, content=body, headers={"content-type": "application/json",
                                                   "x-request-id": rid})
    return r.status_code, FRESH.sub(rb'"\1":0', r.content)


def stored(db: Path) -> dict[str, dict[str, Any]]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        return {rid: json.loads(body) for rid, body in con.execute(
            "SELECT request_id, body FROM traces")}


def test_malformed_requests_get_the_same_answer_through_the_tap_on_smg(tmp_path: Path) -> None:
    db = tmp_path / "tap.db"
    with smg_cluster(free_port_base(40), log_dir=tmp_path / "logs") as ext, \
            tap(ext.router_url, db) as via, httpx.Client(timeout=30) as c:
        seen = {}
        for i, (name, body) in enumerate(MALFORMED):
            direct = post(c, ext.router_url, body, f"direct-{i}")
            tapped = post(c, via, body, f"tap-{i}")
            assert tapped == direct, name
            seen[name] = direct[0]
        wait_until(lambda: len(stored(db)) >= len(MALFORMED), 15, 0.1, what="records",
                   ignore=(sqlite3.Error,))
    print("SMG answers:", seen)
    assert seen["a plain request"] == 200 and seen["a plain stream"] == 200
    rows = stored(db)
    assert {f"tap-{i}" for i in range(len(MALFORMED))} <= set(rows)
    assert rows[f"tap-{len(MALFORMED) - 2}"]["worker"]  # a plain request: SMG's worker


def test_dynamo_worker_id_is_asked_for_and_the_client_sees_its_own_answer(
        tmp_path: Path) -> None:
    from mmlens.demo.dynamo_cluster import dynamo_available

    reason = dynamo_available()
    if reason:
        pytest.skip(reason)
    db = tmp_path / "tap.db"
    with dynamo_cluster(free_port_base(40), log_dir=tmp_path / "logs") as ext, \
            tap(ext.router_url, db, "--dynamo-worker-id") as via, \
            httpx.Client(timeout=60) as c:
        workers = {w["worker_id"] for w in ext.workers}
        cases = {"json": chat(), "stream": chat(stream=True, stream_options={
            "include_usage": True}), "asks timing": chat(nvext={"extra_fields": ["timing"]})}
        for name, req in cases.items():
            body = json.dumps(req).encode()
            raw = post(c, ext.router_url, body, f"direct-{name}")[1]
            tapped = post(c, via, body, f"tap-{name}")[1]
            assert shape(tapped) == shape(raw), name
            assert (b'"worker_id"' in tapped) is False and (b'"timing"' in tapped) == (
                name == "asks timing"), name
        wait_until(lambda: len(stored(db)) >= len(cases), 15, 0.1, what="records",
                   ignore=(sqlite3.Error,))
    rows = stored(db)
    for name in cases:
        row = rows[f"tap-{name}"]
        assert row["worker"] in workers, (name, row["worker"], workers)
        assert row["provenance"]["worker"] == "tap"


def shape(body: bytes) -> list[Any]:
    """The answer's structure: each JSON document's keys (nested, in order) and the types of
    its values (ids, text and timings differ from one answer to the next)."""
    docs = [line[5:].strip() for line in body.splitlines() if line.startswith(b"data:")] \
        or [body]
    return [_keys(json.loads(d)) if d != b"[DONE]" else "[DONE]" for d in docs]


def _keys(v: Any) -> Any:
    if isinstance(v, dict):
        return [(k, _keys(x)) for k, x in v.items()]
    if isinstance(v, list):
        return [_keys(x) for x in v]
    return type(v).__name__
