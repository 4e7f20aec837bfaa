"""Issue 21's live acceptance test: production-shaped traffic mmlens did not send, judged.

Real SMG 1.13 (gRPC, cache-aware, its spill gate's absolute margin lowered from 64 to 4 so 16
in flight can trip it) and the real Dynamo 1.6.1 frontend (KV router), each in front of two
simulated vLLM engines this test starts as separate processes; the official `openai` client
sends 224 requests, 16 at a time, and worker w2 is killed with SIGKILL after 150 answers.
The production-shaped mix: text only, images of seven token counts (a few hot, a tail;
three counts held by two or three different images), user texts of 3 to 43 words, every
sixth streamed.
`mmlens collect` follows the router's log and the engines' KV events (one store) and
`mmlens tap` sits in front of the router (another store). Every request's verdict in each
store's views (snapshot, Routing, explain, the Inspector's read, the Cache page's points, the
Overview's false-hit alert) is compared with the truth: the engines' own per-request log
lines and the router's own routing lines. Each run prints its right/unknown/wrong table
(pytest -s). ``MMLENS_LONG=1`` adds the stress mix, twelve images of one token count and
three texts: on SMG nearly every concurrent pair of image requests has one prompt length, the
worst case for logs + KV events (its table is the README's second).
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from mmlens.layout.synthetic_images import synthetic_png
from mmlens.store.reader import StoreReader
from tests.live_support import free_port, free_port_base, wait_until
from tests.observed.acceptance import (
    Sent,
    Tally,
    Truth,
    ambiguous_reasons,
    dynamo_truth,
    engine_lines,
    measure,
    smg_dispatches,
    smg_truth,
    swappable,
    table,
    wait_judged,
)
from tests.observed.capture import messages
from tests.observed.external import MODEL, dynamo_cluster, smg_cluster
from tests.observed.test_observed_live import config, judge_only, mmlens, running, traces

pytestmark = [pytest.mark.live, pytest.mark.slow]

REQUESTS, IN_FLIGHT, KILL_AFTER = 224, 16, 150


def _data_url(rgb: tuple[int, int, int], width: int, height: int | None = None) -> str:
    return "data:image/png;base64," + base64.b64encode(
        synthetic_png("solid", width, height or width, rgb=rgb)).decode()


# The production-shaped mix: eleven images of eight pixel sizes that Qwen3-VL expands to seven
# token counts (64, 81, 100, 80, 144, 96 and 121), a few hot and a tail; three counts held by
# two or three different images (SMG sees the same token ids for them, the engines key their
# blocks by the image: its content-blind false hits); user texts of 3 to 43 words, the short
# ones sent more often.
HOT = [_data_url((30, 90, 240), 224), _data_url((240, 200, 40), 320),
       _data_url((40, 200, 90), 288), _data_url((200, 60, 200), 384),
       _data_url((90, 90, 250), 64), _data_url((250, 120, 40), 320, 256),
       _data_url((60, 220, 220), 320), _data_url((120, 40, 40), 384, 256),
       _data_url((160, 160, 20), 384), _data_url((250, 30, 120), 64),
       _data_url((20, 120, 120), 352)]
TEXTS = [
    "Describe this image.",
    "What colour is it? Answer in one word.",
    "Write a haiku about it.",
    "Is there any text in this picture? If so, transcribe it exactly.",
    "List every object you can see, one per line, with its position in the frame.",
    "I am writing alt text for a web page. Give me one short sentence that describes this "
    "image for someone who cannot see it.",
    "Compare the colours in this image with a sunset over the sea and explain which feels "
    "warmer, in two or three sentences, without using the word orange.",
    "You are reviewing a product photo for an online shop. Say whether the lighting, "
    "framing and background are good enough to publish, what you would change before it "
    "goes live, and rate it from one to ten with a reason for the score.",
]
# The stress mix (``MMLENS_LONG=1``): twelve images that all expand to 64 tokens (64×64 and
# 224×224 both give 64) and three short texts, so nearly every concurrent pair of image
# requests on a worker has one prompt length: the worst case for logs + KV events on SMG.
ONE_SIZE_IMAGES = [_data_url((20 * i, 90, 240 - 20 * i), 64) for i in range(8)] + [
    _data_url((240, 30 * i, 60), 224) for i in range(4)]
ONE_SIZE_TEXTS = ["Describe this image in detail please.",
                  "What colour is it? Answer in one word.", "Write a haiku about it."]
LONG = os.environ.get("MMLENS_LONG") == "1"


def _production(rnd: random.Random) -> tuple[str | None, str]:
    """One request of the production-shaped mix: text only (15 %) or a hot image, the first
    ones most often; a short text more often than a long one."""
    image = None if rnd.random() < 0.15 else HOT[min(int(rnd.expovariate(0.35)), len(HOT) - 1)]
    return image, TEXTS[min(int(rnd.expovariate(0.4)), len(TEXTS) - 1)]


def workload(mix: str = "production", seed: int = 21,
             ) -> list[tuple[str, str | None, str, bool]]:
    """(request id, image or None, text, stream), every sixth streamed."""
    rnd = random.Random(seed)
    out = []
    for i in range(REQUESTS):
        if mix == "production":
            image, text = _production(rnd)
        else:  # drawn as the runs before the production mix drew theirs
            image = None if rnd.random() < 0.15 else ONE_SIZE_IMAGES[
                min(int(rnd.expovariate(0.35)), 11)]
            text = rnd.choice(ONE_SIZE_TEXTS)
        out.append((f"acc-{i:03d}", image, text, i % 6 == 5))
    return out


def send_all(url: str, on_done: threading.Event, kill_after: int, mix: str,
             ) -> list[Sent]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    done = [0]
    lock = threading.Lock()

    def one(rid: str, image: str | None, text: str, stream: bool) -> Sent:
        s = Sent(rid, stream=stream)
        msgs = messages(image)
        msgs[0]["content"][-1]["text"] = text  # type: ignore[index]
        try:
            if stream:
                chunks = list(client.chat.completions.create(
                    model=MODEL, messages=msgs, max_tokens=16, stream=True,
                    stream_options={"include_usage": True}, extra_headers={"x-request-id": rid}))
                s.response_id = chunks[0].id
            else:
                resp = client.chat.completions.create(
                    model=MODEL, messages=msgs, max_tokens=16,
                    extra_headers={"x-request-id": rid})
                s.response_id = resp.id
                s.nvext = "nvext" in (resp.model_extra or {})
        except openai.OpenAIError as exc:
            s.error = repr(exc)[:200]
        with lock:
            done[0] += 1
            if done[0] == kill_after:
                on_done.set()
        return s

    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        return list(pool.map(lambda w: one(*w), workload(mix)))


@dataclass
class Run:
    dbs: dict[str, Path]
    truth: dict[str, Truth]
    sent: list[Sent]
    # each store's views against the truth, measured once for the tests that read them
    tallies: dict[str, dict[str, Tally]] = field(default_factory=dict)
    disagreements: dict[str, list[str]] = field(default_factory=dict)


STORES = ("logs", "logs+kv", "logs+kv+otlp", "tap")
# The tap's options per router (Dynamo: asking for the worker id, when the tap has it).
TAP_ARGS: dict[str, list[str]] = {"smg": [], "dynamo": ["--dynamo-worker-id"]}


def run(kind: str, tmp_path: Path, mix: str = "production") -> Run:
    """The cluster, the collector and the tap up; the workload through the tap, w2 killed
    after KILL_AFTER answers; the truth from the engines' and the router's own logs."""
    base, otlp = free_port_base(40), (free_port(), free_port())
    dbs = {name: tmp_path / f"{name}.db" for name in STORES}
    spans = {"otlp_grpc": f"127.0.0.1:{otlp[0]}", "worker_otlp": f"http://127.0.0.1:{otlp[1]}"}
    cluster = smg_cluster(base, log_dir=tmp_path / "logs", cache_trace_header=True,
                          worker_args=["--log-requests", "--speed", "0.25"],
                          smg_args=["--balance-abs-threshold", "4"], **spans) \
        if kind == "smg" else dynamo_cluster(base, log_dir=tmp_path / "logs",
                                             worker_args=["--speed", "0.25"], **spans)
    with cluster as ext:
        tap_port = free_port()
        procs = [
            mmlens("collect", "--db", str(dbs["logs"]), "--config",
                   str(config(tmp_path / "logs.toml", ext, kind, None, kv=False))),
            mmlens("collect", "--db", str(dbs["logs+kv"]), "--config",
                   str(config(tmp_path / "logs-kv.toml", ext, kind, None))),
            mmlens("collect", "--db", str(dbs["logs+kv+otlp"]), "--config",
                   str(config(tmp_path / "otlp.toml", ext, kind, otlp))),
            mmlens("tap", "--listen", f"127.0.0.1:{tap_port}", "--upstream", ext.router_url,
                   "--db", str(dbs["tap"]), *TAP_ARGS[kind]),
            # The tap only records: the lead collector on its store judges (no log, no KV).
            mmlens("collect", "--db", str(dbs["tap"]), "--config",
                   str(judge_only(tmp_path / "tap.toml", ext, kind))),
        ]
        with running(procs):
            tap_url = f"http://127.0.0.1:{tap_port}"
            wait_until(lambda: httpx.get(tap_url + "/v1/models", timeout=1).status_code == 200,
                       90, what="tap", ignore=(httpx.HTTPError,))
            for port in otlp:  # spans exported before the receiver listens are lost
                wait_until(lambda port=port: socket.create_connection(
                    ("127.0.0.1", port), timeout=1).close() is None, 60,
                    what=f"OTLP receiver :{port}", ignore=(OSError,))
            time.sleep(2.0)  # the collectors' KV subscriptions settle
            kill_now = threading.Event()
            w2 = next(p for p in ext.procs if p.name == "worker-w2")

            def killer() -> None:
                if kill_now.wait(120):
                    os.kill(w2.popen.pid, signal.SIGKILL)

            k = threading.Thread(target=killer, daemon=True)
            k.start()
            sent = send_all(tap_url, kill_now, KILL_AFTER, mix)
            k.join(5)
            for name, db in dbs.items():
                wait_until(lambda db=db: db.exists() and traces(db) >= REQUESTS, 60,
                           what=f"{name} store", ignore=(Exception,))
            # The verdict job judges a request 12 s after it ended: the last KV events, log
            # lines and spans (routers batch them 5 s) are in by then, no sleep needed.
            pending = {name: wait_judged(db, [w[0] for w in workload(mix)]) for name, db in
                       dbs.items()}
            assert pending == dict.fromkeys(dbs, 0), pending
        assert ext.router_log is not None
        logs = [ext.log_dir / f"worker-w{i}.log" for i in (1, 2)]
        if kind == "smg":
            truth = smg_truth(sent, smg_dispatches(ext.router_log), engine_lines(logs))
        else:
            truth = dynamo_truth(sent, ext.router_log, engine_lines(logs, "request"))
    (tmp_path / "sent.json").write_text(json.dumps([vars(x) for x in sent], indent=1))
    return Run(dbs, truth, sent)


def _dynamo(tmp_path_factory: pytest.TempPathFactory, mix: str) -> Run:
    from mmlens.demo.dynamo_cluster import dynamo_available

    reason = dynamo_available()
    if reason:
        pytest.skip(reason)
    return run("dynamo", tmp_path_factory.mktemp(f"dynamo-{mix}"), mix)


@pytest.fixture(scope="module")
def smg_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run("smg", tmp_path_factory.mktemp("smg-production"))


@pytest.fixture(scope="module")
def dynamo_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _dynamo(tmp_path_factory, "production")


needs_long = pytest.mark.skipif(not LONG, reason="the stress mix: MMLENS_LONG=1")


@pytest.fixture(scope="module")
def smg_stress_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run("smg", tmp_path_factory.mktemp("smg-one-size"), "one_size")


@pytest.fixture(scope="module")
def dynamo_stress_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _dynamo(tmp_path_factory, "one_size")


def check_stored_once(run: Run, kind: str) -> None:
    truth = run.truth
    assert len(truth) == REQUESTS
    kinds = {t.category for t in truth.values()}
    # Hits, content-blind false hits, cold starts, a spill gate that fired, retries after
    # the SIGKILL: the traffic a production cluster has.
    assert {"hit", "cold"} <= kinds, kinds
    if kind == "smg":  # SMG is content-blind, retries on another worker, has a spill gate
        assert "false_hit" in kinds
        assert any(t.failed_over for t in truth.values())
        assert any(t.spilled for t in truth.values())
    else:  # Dynamo answered 503 to the requests in flight on the dead worker
        assert "error" in kinds
        # The tap asked Dynamo for the worker id; the client, who did not, never sees it.
        assert not any(x.nvext for x in run.sent)
    for name, db in run.dbs.items():
        reader = StoreReader(db)
        try:
            assert reader.trace_count() == REQUESTS, name
            for rid, t in truth.items():
                rec = reader.trace(rid)
                assert rec is not None, (name, rid)
                if t.category != "error" and (kind == "smg" or name != "tap" or TAP_ARGS[kind]):
                    # the worker that served, after a retry too
                    assert rec.worker == t.worker, (name, rid, rec.worker, t)
                if name == "tap" and t.cached_tokens is not None:
                    assert rec.cached_tokens == t.cached_tokens, (rid, rec.cached_tokens, t)
                elif name in ("logs", "logs+kv"):  # the router's log: nothing of the cache
                    assert rec.cached_tokens is None and "cached_tokens" not in rec.provenance
        finally:
            reader.close()


def measured(run: Run) -> Run:
    """Every store's views against the truth (once a run), printed: the README's table."""
    if run.tallies:
        return run
    truth, dbs = run.truth, run.dbs
    for name, db in dbs.items():
        run.tallies[name], run.disagreements[name] = measure(db, truth)
    print("\n" + table(run.tallies, truth))
    errors = [f"{x.request_id}: {x.error}" for x in run.sent if x.error]
    print(f"client errors {len(errors)}: {errors[:4]}")
    for name, rows in run.disagreements.items():
        print(f"{name}: views disagree on {len(rows)} requests, e.g. {rows[:3]}")
    for name, views in run.tallies.items():
        for view, t in views.items():
            print(f"{name}/{view} wrong: {t.wrong_examples}")
    print("logs+kv ambiguous, by reason: " + ", ".join(
        f"{n} {why}" for why, n in ambiguous_reasons(dbs["logs+kv"]).most_common()))
    print("logs+kv ambiguous, why undecidable: " + ", ".join(
        f"{n} {why}" for why, n in swappable(dbs["logs+kv"], dbs["tap"], truth).most_common()))
    return run


def check_verdicts(run: Run) -> None:
    """Issue 21's Done-when but the share and the logs + KV events' rightness: snapshot,
    Routing, explain, the Inspector, the Cache page's points and the Overview's false-hit
    alert agree on every request of every store; logs + KV events judge every request; the
    tap is right on every request."""
    measured(run)
    assert run.disagreements == {name: [] for name in run.dbs}
    for view, t in run.tallies["logs+kv"].items():
        assert t.total == REQUESTS, (view, t)
    for view, t in run.tallies["tap"].items():
        assert t.right == REQUESTS, (view, t)


def check_definite_right(run: Run) -> None:
    """Issue 21: every definite verdict from logs + KV events is right."""
    for view, t in measured(run).tallies["logs+kv"].items():
        assert t.wrong == 0, (view, t)


def check_definite_share(run: Run) -> None:
    """Issue 21's share: logs + KV events give a definite verdict on >= 95 % of requests."""
    for view, t in measured(run).tallies["logs+kv"].items():
        assert t.definite >= REQUESTS * 0.95, (view, t)


def test_smg_traffic_is_production_shaped_and_every_request_stored_once(smg_run: Run) -> None:
    check_stored_once(smg_run, "smg")


def test_smg_verdicts_against_the_engines_own_logs(smg_run: Run) -> None:
    check_verdicts(smg_run)


# A CI run on 2 Dec judged 2 of 224 SMG requests wrong from logs + KV events (acc-110 "hit",
# truth false hit; acc-143 "false_hit", truth hit): most likely blocks stored on w2 by a
# request in flight when w2 was killed (retried on w1, so w2's engine never logged it), read
# as a same-length request's prefill. A failed attempt's run now competes on its worker
# (tests/collectors/test_verdicts_recorded.py: a later run's store, wrong without it).
# A plain test again: no definite verdict was wrong in 5 live runs and 2 CI runs since.
def test_smg_definite_verdicts_from_logs_and_kv_events_are_right(smg_run: Run) -> None:
    check_definite_right(smg_run)


# Issue 21's share, strictly: met on every production-shaped run with the rules of 3 December
# (SMG 96.0-98.7 %, Dynamo 96.9-99.1 %, runs L-P; one store of an earlier run re-judged,
# recorded before the straddled prompt ends were read, 94.6 %). It rests on the traffic's
# timing, not only the code: at 16 in flight, requests of one exact prompt length with
# different same-size images overlap on a worker, and which of them computed a chain fits the
# router's log and the KV events both ways (SMG's log names no image's identity). Such
# requests read "hit_or_...", never a wrong verdict (README, "Which sources give which
# verdicts"); the stress mix (MMLENS_LONG=1) is all such pairs and only prints its share.
def test_smg_verdicts_are_definite_on_95_percent(smg_run: Run) -> None:
    check_definite_share(smg_run)


def test_dynamo_traffic_is_production_shaped_and_every_request_stored_once(
        dynamo_run: Run) -> None:
    check_stored_once(dynamo_run, "dynamo")


def test_dynamo_verdicts_against_the_engines_own_logs(dynamo_run: Run) -> None:
    check_verdicts(dynamo_run)
    check_definite_right(dynamo_run)


def test_dynamo_verdicts_are_definite_on_95_percent(dynamo_run: Run) -> None:
    check_definite_share(dynamo_run)


# The stress mix: the same checks, its definite share printed only (the README's worst case).
@needs_long
def test_smg_one_size_stress_verdicts(smg_stress_run: Run) -> None:
    check_stored_once(smg_stress_run, "smg")
    check_verdicts(smg_stress_run)
    check_definite_right(smg_stress_run)


@needs_long
def test_dynamo_one_size_stress_verdicts(dynamo_stress_run: Run) -> None:
    check_stored_once(dynamo_stress_run, "dynamo")
    check_verdicts(dynamo_stress_run)
    check_definite_right(dynamo_stress_run)
