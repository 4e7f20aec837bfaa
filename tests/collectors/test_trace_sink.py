"""One path for traces: the Lab's sender, the warm-up, `mmlens check --db`, `mmlens collect
--workload` and observed requests all record through ``TraceSink``; images are probed once;
the prompt text reaches the store only when the sender opted in; routing decisions are joined
when read, never when written."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from mmlens.collectors import warmup
from mmlens.collectors.runner import CollectorRunner
from mmlens.collectors.sender import Sender
from mmlens.collectors.trace_sink import SentRequest, TraceSink

from mmlens.analysis.request_view import rebuild_parts
from mmlens.cli import check as check_cli
from mmlens.cli.collect import run_workload
from mmlens.config import Config, RouterTarget
from mmlens.ingest.observed import fragment, put
from mmlens.layout import sent
from mmlens.layout.imageinfo import ImageInfo
from mmlens.layout.sent import ImagePart
from mmlens.layout.synthetic_images import synthetic_png
from mmlens.records import RequestTrace
from mmlens.store.reader import StoreReader
from tests.collectors.loopback import Loopback, Route

SECRET = "my private question about this red square"
JSON = "application/json"


def _reply(request: httpx.Request | None = None) -> httpx.Response:
    return httpx.Response(200, json={"id": "chatcmpl-1", "usage": {
        "prompt_tokens": 81, "completion_tokens": 2, "prompt_tokens_details": {
            "cached_tokens": 0}}})


def _router() -> Loopback:
    body = json.dumps(_reply().json())
    return Loopback({"/v1/chat/completions": Route(body, content_type=JSON),
                     "/v1/models": Route('{"data": [{"id": "m"}]}', content_type=JSON)})


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The request ids every TraceSink recorded, in order."""
    seen: list[str] = []
    record, record_all = TraceSink.record, TraceSink.record_all

    def spy(self: TraceSink, trace: RequestTrace, sent_request: SentRequest | None = None,
            ) -> RequestTrace:
        seen.append(trace.request_id)
        return record(self, trace, sent_request)

    def spy_all(self: TraceSink, traces: Sequence[RequestTrace]) -> None:
        seen.extend(t.request_id for t in traces)
        return record_all(self, traces)

    monkeypatch.setattr(TraceSink, "record", spy)
    monkeypatch.setattr(TraceSink, "record_all", spy_all)
    return seen


def _bodies(db: Path) -> list[str]:
    con = sqlite3.connect(db)
    try:
        return [b for (b,) in con.execute("SELECT body FROM traces")]
    finally:
        con.close()


def _red() -> bytes:
    return synthetic_png("solid", 64, 64, rgb=(200, 30, 30))


def test_lab_sender_keeps_the_text_only_when_asked(tmp_path: Path, recorded: list) -> None:
    db = tmp_path / "s.db"
    sender = Sender(db, client=httpx.Client(transport=httpx.MockTransport(_reply)))
    try:
        private = sender.send("http://r", "m", SECRET, [ImagePart(_red())],
                              layout_model="qwen3-vl")
        kept = sender.send("http://r", "m", SECRET, [ImagePart(_red())],
                           layout_model="qwen3-vl", keep_text=True)
    finally:
        sender.close()
    assert recorded == [private.request_id, kept.request_id]
    assert sum(SECRET in body for body in _bodies(db)) == 1  # only the opted-in one
    reader = StoreReader(db)
    try:
        stored = reader.trace(private.request_id)
        again = reader.trace(kept.request_id)
    finally:
        reader.close()
    assert stored is not None and again is not None
    lay = stored.expected_layout
    # Without the text: counts, spans, content keys, image sizes and identities.
    assert lay is not None and lay.text is None and lay.layout_model is None
    assert lay.block_keys and lay.spans and lay.engine_prompt_tokens == 81
    assert (stored.images[0].width, stored.images[0].height) == (64, 64)
    assert set(stored.images[0].identities) == {"smg_blake3", "dynamo_mm_hash_url"}
    assert rebuild_parts(stored) is None
    assert again.expected_layout is not None and again.expected_layout.text == SECRET
    assert rebuild_parts(again) is not None
    assert again.expected_layout.block_keys == lay.block_keys


def test_each_image_is_probed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    probe = sent.probe_image

    def counting(data: bytes, *args: Any) -> ImageInfo:
        calls.append(len(data))
        return probe(data, *args)

    monkeypatch.setattr(sent, "probe_image", counting)
    sender = Sender(tmp_path / "s.db", client=httpx.Client(transport=httpx.MockTransport(_reply)))
    try:
        t = sender.send("http://r", "m", "two", [ImagePart(_red()), ImagePart(_red())],
                        layout_model="qwen3-vl")
    finally:
        sender.close()
    assert len(calls) == 2 and t.expected_layout is not None and t.expected_layout.ok


def test_warmup_records_through_the_sink(tmp_path: Path, recorded: list) -> None:
    db, ready = tmp_path / "s.db", tmp_path / "ready.json"
    with _router() as router:
        ready.write_text(json.dumps({"event": "ready", "router": router.url,
                                     "models": [{"id": "m", "family": "qwen3-vl"}]}))
        assert warmup.main(["--ready-file", str(ready), "--db", str(db), "--delay", "0"]) == 0
    sent = sum(len(step.requests) for step in warmup.workload())
    assert len(recorded) == sent == len(_bodies(db))
    assert all(warmup.TEXT in b or "Hello" in b or "Compare" in b for b in _bodies(db))


def test_check_with_db_records_every_request_through_the_sink(tmp_path: Path, capsys,
                                                              recorded: list) -> None:
    db = tmp_path / "s.db"
    with _router() as router:
        rc = check_cli.main(["--router", router.url, "--model", "qwen3-vl", "--scenario",
                             "repeat", "--block-size", "16", "--db", str(db), "--json"])
    assert rc in (0, 1)  # judged on a canned router: the verdict is not the point here
    out = json.loads(capsys.readouterr().out)
    sent_ids = [r["request_id"] for r in out["scenarios"][0]["requests"]]
    assert recorded == sent_ids and len(_bodies(db)) == len(sent_ids) == 3


def test_collect_workload_and_observed_requests_record_through_the_sink(
        tmp_path: Path, recorded: list) -> None:
    db = tmp_path / "s.db"
    from mmlens.store.sqlite import Store

    store = Store(db)
    with _router() as router, httpx.Client() as client:
        runner = CollectorRunner(Config(routers=[RouterTarget(
            "r", "smg", router.url, discover_workers=False)]), store, http=client)
        try:
            run_workload(runner, client, 2, "m", "qwen3-vl")
            seen = fragment("observed-1", "router_log", 1.0, router_kind="smg")
            put(seen, "worker", "grpc://w1", "router_log:smg")
            runner.observed.add([seen])
            runner.observed.flush(force=True)
        finally:
            runner.close()
            store.close()
    assert len(recorded) == 3 and recorded[-1] == "observed-1"
    assert len(_bodies(db)) == 3
