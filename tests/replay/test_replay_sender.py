"""Sending a replay through an injected transport: the planned timing (on a fake clock), at
most N in flight, image bytes per identity on the wire, errors counted, and the summary's
rates and hit rates from what the router answered; the CLI end to end on a store."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from mmlens.collectors.replay_sender import Replayer

from mmlens.cli import replay as replay_cli
from mmlens.layout.modeldir import resolve_model
from mmlens.replay.plan import Plan, plan
from mmlens.replay.summary import summarize
from mmlens.replay.text import TextFitter
from mmlens.store.open import open_store
from mmlens.store.reader import open_reader
from tests.replay.support import mixed_traces, recorded


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Router:
    """An OpenAI-compatible router: caches whole prompts by their image URLs and text, so a
    repeat answers its prompt cached minus the last block, as a prefix cache would."""

    def __init__(self, fail_text: str | None = None, hold_s: float = 0.0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.by_id: dict[str, dict[str, Any]] = {}
        self.seen: set[str] = set()
        self.fail_text = fail_text
        self.hold_s = hold_s
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        with self.lock:
            self.bodies.append(body)
            self.by_id[request.headers["x-request-id"]] = body
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            time.sleep(self.hold_s)
            parts = body["messages"][0]["content"]
            text = parts[-1]["text"]
            if text == self.fail_text:
                return httpx.Response(503, json={"error": {"code": "no_worker",
                                                           "message": "down"}})
            key = json.dumps(parts)
            with self.lock:
                cached = 64 if key in self.seen else 0
                self.seen.add(key)
            return httpx.Response(200, headers={"x-smg-routed-worker-id": "grpc://w1"}, json={
                "id": "c", "choices": [{"message": {"content": "ok"}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 1,
                          "prompt_tokens_details": {"cached_tokens": cached}}})
        finally:
            with self.lock:
                self.in_flight -= 1


@pytest.fixture(scope="module")
def the_plan() -> Plan:
    return plan(recorded(mixed_traces()), TextFitter(resolve_model("qwen3-vl")), speed=2.0)


def test_sends_on_the_planned_schedule_with_the_identities_bytes(the_plan: Plan) -> None:
    router, clock = Router(), FakeClock()
    client = httpx.Client(transport=httpx.MockTransport(router))
    replayer = Replayer(client, concurrency=4, clock=clock, sleep=clock.sleep)
    outcomes, _ = replayer.send_all(the_plan, "http://router")
    assert [o.sent_at_s for o in outcomes] == [p.offset_s for p in the_plan.requests]
    summary = summarize(the_plan, outcomes, 2.5)
    assert (summary.sent, summary.ok, summary.errors) == (7, 7, {})
    assert summary.late_max_s == 0.0
    assert summary.achieved_rate == pytest.approx(summary.asked_rate) == pytest.approx(2.4)
    sent = {o.planned.source_id: router.by_id[o.request_id]["messages"][0]["content"]
            for o in outcomes}
    red, again, blue = (sent[k] for k in ("red", "red-again", "blue"))
    # red and red-again: one identity and one text, sent as the same bytes and words; blue
    # (same size and words) as other bytes.
    assert red == again and len(red) == 2
    assert blue[1] == red[1] and blue[0] != red[0]
    assert {b["max_tokens"] for b in router.bodies} == {12}
    streamed = {o.planned.source_id for o in outcomes if router.by_id[o.request_id]["stream"]}
    assert streamed == {"plot"}  # as recorded
    # The router answered the two repeats (red-again, haiku-again) cached.
    assert summary.hit_rate == pytest.approx(128 / 700)
    assert summary.recorded_hit_rate == pytest.approx(
        (304 + 16) / sum(p.recorded_prompt or 0 for p in the_plan.requests))
    assert summary.workers == {"grpc://w1": 7}


def test_at_most_n_in_flight_and_the_wait_counts_as_late(the_plan: Plan) -> None:
    router = Router(hold_s=0.2)
    client = httpx.Client(transport=httpx.MockTransport(router))
    at_once = Plan([replace(p, offset_s=0.0) for p in the_plan.requests], speed=1.0,
                   recorded_span_s=0.0)
    summary = Replayer(client, concurrency=2).run(at_once, "http://router")
    assert router.max_in_flight == 2 and summary.sent == 7
    assert summary.late_max_s is not None and summary.late_max_s >= 0.5  # 3 rounds of 0.2 s


def test_errors_are_counted_by_code(the_plan: Plan) -> None:
    haiku = next(p.text for p in the_plan.requests if p.source_id == "haiku")
    router, clock = Router(fail_text=haiku), FakeClock()
    client = httpx.Client(transport=httpx.MockTransport(router))
    summary = Replayer(client, clock=clock, sleep=clock.sleep).run(the_plan, "http://r")
    assert (summary.sent, summary.ok, summary.errors) == (7, 5, {"no_worker": 2})
    assert any("error no_worker: 2" in line for line in summary.lines())


def test_cli_replays_a_store_window_and_records_the_replay(tmp_path: Path) -> None:
    db, out = tmp_path / "rec.db", tmp_path / "replay.db"
    store = open_store(db)
    store.add_traces(mixed_traces())
    store.close()
    router = Router()
    client = httpx.Client(transport=httpx.MockTransport(router))
    code = replay_cli.main(["--db", str(db), "--to", "http://router", "--speed", "100",
                            "--record-db", str(out), "--json", "--until", "1800000004.5"],
                           client=client)
    assert code == 0
    # The window ends before red-hd: six requests, each traced in the replay's store.
    reader = open_reader(out)
    try:
        replayed = reader.window_traces(0, 2e9)
    finally:
        reader.close()
    assert len(replayed) == len(router.bodies) == 6
    assert all(t.request_id.startswith("replay-") and t.expected_layout is not None
               for t in replayed)


def test_cli_refuses_an_empty_window(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     ) -> None:
    db = tmp_path / "rec.db"
    store = open_store(db)
    store.add_traces(mixed_traces())
    store.close()
    assert replay_cli.main(["--db", str(db), "--to", "http://r", "--since", "2100-01-01"]) == 2
    assert "no recorded requests" in capsys.readouterr().err
