"""Traffic mmlens did not send, explained: the official `openai` client talks to the real SMG
1.13 (gRPC) and the real Dynamo 1.6.1 frontend, in front of simulated workers this test
starts itself; `mmlens collect` follows the router log and the workers' KV events (one store)
and also receives OTLP spans (another store); `mmlens tap` sits between client and router
(a third store). `mmlens explain` then classifies every request from each store on its own:
router logs only, logs with OTLP, and the tap — a content-blind false hit on SMG among them."""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from mmlens.collectors.media_server import MediaServer

from mmlens.layout.sent import describe_image
from mmlens.layout.synthetic_images import synthetic_png
from mmlens.records import RequestTrace
from tests.live_support import REPO, free_port, free_port_base, stop_process, wait_until
from tests.observed.capture import messages
from tests.observed.external import MODEL, External, dynamo_cluster, smg_cluster

pytestmark = [pytest.mark.live, pytest.mark.slow]

RED = "data:image/png;base64," + base64.b64encode(
    synthetic_png("solid", 64, 64, rgb=(200, 30, 30))).decode()
BLUE = "data:image/png;base64," + base64.b64encode(
    synthetic_png("solid", 224, 224, rgb=(30, 30, 200))).decode()
GREEN = synthetic_png("solid", 64, 64, rgb=(30, 200, 30))  # sent by URL (GREEN_URL)
GREEN_URL = "url:green"
# (name, image, stream); red, blue and green all expand to 64 image tokens (Qwen3-VL).
WORKLOAD = [("red", RED, False), ("red-again", RED, False), ("blue", BLUE, False),
            ("text", None, False), ("red-stream", RED, True), ("green-url", GREEN_URL, False)]
EXPECTED = {
    "smg": {"red": "cold", "red-again": "hit", "blue": "false_hit", "text": "cold",
            "red-stream": "hit", "green-url": "false_hit"},
    # Dynamo routes on per-image pad values: blue is a new image to it, not a false hit.
    "dynamo": {"red": "cold", "red-again": "hit", "blue": "cold", "text": "cold",
               "red-stream": "hit", "green-url": "cold"},
}


def mmlens(*args: str, **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "mmlens", *args], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)


def config(path: Path, ext: External, kind: str, otlp: tuple[int, int] | None,
           kv: bool = True, worker_logs: bool = True) -> Path:
    lines = ["interval_s = 0.5", "[[router]]", 'name = "r"', f'kind = "{kind}"',
             f'url = "{ext.router_url}"', f'log_file = "{ext.router_log}"',
             "discover_workers = false"]
    for w in ext.workers:
        name = w.get("grpc") or w["worker_id"]
        lines += ["[[worker]]", f'name = "{w["name"]}"', f'router_url = "{name}"']
        if w.get("model"):
            lines.append(f'model = "{w["model"]}"')
        if w.get("log") and worker_logs:
            lines.append(f'log_file = "{w["log"]}"')
        if kv:
            lines += [f'kv_events = "{w["kv_events"]}"', f'kv_replay = "{w["kv_replay"]}"']
    if otlp:
        lines += ["[otlp]", f"grpc_port = {otlp[0]}", f"http_port = {otlp[1]}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def judge_only(path: Path, ext: External, kind: str) -> Path:
    """A collector that only judges the store it is given (the tap's: the tap records, the
    lead collector's verdict job judges); no log, no KV events."""
    path.write_text("\n".join(["interval_s = 0.5", "[[router]]", 'name = "r"',
                               f'kind = "{kind}"', f'url = "{ext.router_url}"',
                               "discover_workers = false"]) + "\n")
    return path


@contextlib.contextmanager
def running(procs: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    try:
        yield
    finally:
        for p in procs:
            stop_process(p, signal.SIGINT, 30)


def send(base_url: str, green_url: str) -> dict[str, str]:
    """The workload through `base_url`, one request at a time; the id each response had."""
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0)
    ids = {}
    for name, image, stream in WORKLOAD:
        image = green_url if image == GREEN_URL else image
        if stream:
            chunks = list(client.chat.completions.create(
                model=MODEL, messages=messages(image), max_tokens=8, stream=True,
                stream_options={"include_usage": True}))
            ids[name] = chunks[0].id
        else:
            ids[name] = client.chat.completions.create(
                model=MODEL, messages=messages(image), max_tokens=8).id
        time.sleep(0.4)  # one request at a time on a worker: its KV events tell them apart
    return ids


def explain(db: Path, rid: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "mmlens", "explain", "--db", str(db),
                          "--request", rid, "--json"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def traces(db: Path) -> int:
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
        return int(c.execute("SELECT count(*) FROM traces").fetchone()[0])


def run_observed(tmp_path: Path, kind: str) -> None:
    otlp = (free_port(), free_port())
    base = free_port_base(40)
    cluster = smg_cluster if kind == "smg" else dynamo_cluster
    dbs = {mode: tmp_path / f"{mode}.db" for mode in ("logs", "otlp", "tap")}
    with MediaServer() as media, cluster(
            base, otlp_grpc=f"127.0.0.1:{otlp[0]}", worker_otlp=f"http://127.0.0.1:{otlp[1]}",
            log_dir=tmp_path / "logs", cache_trace_header=True,
            media_hosts=[media.base_url.removeprefix("http://")]) as ext:
        tap_port = free_port()
        procs = [
            mmlens("collect", "--db", str(dbs["logs"]), "--config",
                   str(config(tmp_path / "logs.toml", ext, kind, None))),
            mmlens("collect", "--db", str(dbs["otlp"]), "--config",
                   str(config(tmp_path / "otlp.toml", ext, kind, otlp))),
            mmlens("tap", "--listen", f"127.0.0.1:{tap_port}", "--upstream", ext.router_url,
                   "--db", str(dbs["tap"]), "--fetch-images", "--fetch-host", "127.0.0.1"),
            mmlens("collect", "--db", str(dbs["tap"]), "--config",
                   str(judge_only(tmp_path / "tap.toml", ext, kind))),
        ]
        with running(procs):
            tap_url = f"http://127.0.0.1:{tap_port}"
            wait_until(lambda: httpx.get(tap_url + "/v1/models", timeout=1).status_code == 200,
                       30, what="tap", ignore=(httpx.HTTPError,))
            time.sleep(2.0)  # the collectors' KV subscriptions settle
            ids = send(tap_url, media.add("green.png", GREEN))
            for mode, db in dbs.items():
                wait_until(lambda db=db: db.exists() and traces(db) >= len(WORKLOAD), 30,
                           what=f"{mode} store", ignore=(Exception,))
            time.sleep(7.0)  # routers batch their spans for up to 5 s
            # On a loaded machine a batch can come later still: judged again until each
            # store's verdicts are the expected ones, for up to 30 s more.
            deadline = time.monotonic() + 30.0
            while True:
                judged = {mode: {name: explain(db, rid) for name, rid in ids.items()}
                          for mode, db in dbs.items()}
                if all({n: j["category"] for n, j in got.items()} == EXPECTED[kind]
                       for got in judged.values()) or time.monotonic() > deadline:
                    break
                time.sleep(3.0)
    for mode, got in judged.items():
        # From SMG's log, a stream's end is its completion line's whole second: the next
        # request's dispatch, after that line, ends its window (``judgement.order``).
        verdicts = {name: j["category"] for name, j in got.items()}
        assert verdicts == EXPECTED[kind], (mode, {n: j["headline"] for n, j in got.items()})
        want = {"logs": "kv_events", "otlp": "otlp:llm_request", "tap": "tap"}[mode]
        for name, j in got.items():
            assert j["sources"], j
            if j["category"] in ("hit", "false_hit"):  # judged on what the engine realized
                assert j["sources"]["realized"] == want, (mode, name, j)
    # The tap fetched the URL image itself: its record knows it as the inline bytes would.
    (green,) = stored_trace(dbs["tap"], ids["green-url"]).images
    inline = describe_image("data:image/png;base64," + base64.b64encode(GREEN).decode(), GREEN)
    assert (green.url_kind, green.width, green.height, green.byte_size) == (
        "http", 64, 64, len(GREEN))
    assert green.identities["smg_blake3"] == inline.info.identities["smg_blake3"]


def stored_trace(db: Path, rid: str) -> RequestTrace:
    from mmlens.store.open import open_store

    store = open_store(str(db), readonly=True)
    try:
        t = store.trace(rid) or store.trace_by_key(rid)
    finally:
        store.close()
    assert t is not None, rid
    return t


def test_smg_traffic_explained_from_logs_spans_and_tap(tmp_path: Path) -> None:
    run_observed(tmp_path, "smg")


def test_dynamo_traffic_explained_from_logs_spans_and_tap(tmp_path: Path) -> None:
    from mmlens.demo.dynamo_cluster import dynamo_available

    reason = dynamo_available()
    if reason:
        pytest.skip(reason)
    run_observed(tmp_path, "dynamo")
