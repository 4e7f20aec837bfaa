"""`mmlens tap` as it runs: its recorder in a process of its own writes every record and one
health row that carries the proxy's counters and the recorder's, flushed while idle."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from mmlens.cli.sched_tuning import SLICE_NS, slice_ns
from mmlens.records import CollectorHealth
from mmlens.store.open import open_store
from tests.live_support import REPO, free_port, stop_process, wait_until
from tests.observed.tap_support import Served, odd_app


def tap_health(db: Path) -> CollectorHealth | None:
    with contextlib.closing(open_store(db, readonly=True)) as store:
        return next((h for h in store.health() if h.collector == "tap"), None)


def proxy_and_recorder_slices(pid: int) -> tuple[int | None, list[int | None]] | None:
    """The time slice of the tap's loop thread and of its child processes' threads, where
    the kernel takes a slice of a thread's choosing (6.12 on)."""
    if tuple(int(x) for x in re.findall(r"\d+", platform.release())[:2]) < (6, 12):
        return None
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return slice_ns(pid), [slice_ns(int(t)) for k in kids for t in os.listdir(f"/proc/{k}/task")]


def start_tap(port: int, upstream: str, db: Path, out: int) -> subprocess.Popen[bytes]:
    """`mmlens tap` on 127.0.0.1:``port`` in front of ``upstream``, recording into ``db``."""
    return subprocess.Popen([sys.executable, "-m", "mmlens", "tap", "--listen",
                             f"127.0.0.1:{port}", "--upstream", upstream, "--db", str(db)],
                            cwd=REPO, stdout=out, stderr=out)


def test_the_tap_process_records_everything_and_one_health_row_says_so(tmp_path: Path
                                                                         ) -> None:
    router = Served(odd_app(), free_port())
    port, db = free_port(), tmp_path / "tap.db"
    proc = start_tap(port, router.url, db, subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.post(url + "/v1/chat/completions", json={}, timeout=1,
                                      headers={"x-request-id": "probe"}).status_code == 200,
                   30, what="tap", ignore=(httpx.HTTPError,))
        slices = proxy_and_recorder_slices(proc.pid)
        with httpx.Client() as c:
            for i in range(20):
                r = c.post(url + "/v1/chat/completions", headers={"x-request-id": f"r{i}"},
                           json={"model": "m", "messages": [], "stream": i % 2 == 1})
                assert r.status_code == 200
        # No more traffic: the row catches up by itself (the old tap's lagged for minutes):
        # the recorder's count and the proxy's, which comes every half second.
        # (A row written as the recorder stored the last one may still carry the proxy's
        # count from its half-second tick before: the next one has it.)
        row = wait_until(lambda: (h := tap_health(db)) and h.counters.get("recorded") == 21
                         and h.counters.get("requests") == 21 and h, 10, 0.1,
                         what="the health row", ignore=(Exception,))
        # (read once it recorded: it is running then)
        recorder = [int(k) for k in Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
                    .read_text().split() if b"resource_tracker" not in
                    Path(f"/proc/{k}/cmdline").read_bytes()]
        policies = {os.sched_getscheduler(int(t)) for k in recorder
                    for t in os.listdir(f"/proc/{k}/task")}
    finally:
        stop_process(proc, signal.SIGINT, 30)
        router.stop()
    assert row.counters["requests"] == 21  # the proxy's count (the probe included)
    assert "store_backlog" in row.counters and "proxy_updated" not in row.counters
    with contextlib.closing(open_store(db, readonly=True)) as store:
        ids = {t.request_id for t in store.traces(limit=50)}
    assert ids == {f"r{i}" for i in range(20)} | {"probe"}
    assert proc.returncode == 0
    assert policies == {os.SCHED_IDLE}  # the recorder runs when the proxy does not
    if slices is not None:  # the proxy's loop preempts what shares its core; not the recorder
        assert slices[0] == SLICE_NS and slices[1] and SLICE_NS not in slices[1], slices


def test_an_image_sent_slowly_delays_no_other_connection(tmp_path: Path) -> None:
    """A 4 MB image sent over a second and a half: ten small requests on another connection
    are answered while it is still coming, and both are recorded (the big one with its
    image's size), by the recorder process after the answers."""
    router = Served(odd_app(), free_port())
    port, db = free_port(), tmp_path / "tap.db"
    proc = start_tap(port, router.url, db, subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    image = b"\x89PNG\r\n\x1a\n" + os.urandom(4 << 20)
    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + base64.b64encode(image).decode()}}]}]}).encode()
    slow: dict[str, object] = {}

    def send_slowly() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                      b"content-type: application/json\r\nx-request-id: big\r\n"
                      b"content-length: %d\r\n\r\n" % len(big))
            step = len(big) // 30 + 1
            for i in range(0, len(big), step):
                s.sendall(big[i:i + step])
                time.sleep(0.05)
            slow["sent"] = time.monotonic()
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += s.recv(65536)
            slow["status"] = answer.split(b" ", 2)[1]

    try:
        wait_until(lambda: httpx.post(url + "/v1/chat/completions", json={}, timeout=1,
                                      headers={"x-request-id": "probe"}).status_code == 200,
                   30, what="tap", ignore=(httpx.HTTPError,))
        sender = threading.Thread(target=send_slowly)
        sender.start()
        time.sleep(0.2)  # the big one under way
        done = []
        with httpx.Client() as c:
            for i in range(10):
                r = c.post(url + "/v1/chat/completions", headers={"x-request-id": f"s{i}"},
                           json={"model": "m", "messages": []})
                assert r.status_code == 200
                done.append(time.monotonic())
        sender.join(30)
        with contextlib.closing(open_store(db, readonly=True)) as store:
            got = wait_until(lambda: (t := store.trace("big")) and t.images and t, 30, 0.1,
                             what="the big one recorded", ignore=(Exception,))
            assert {t.request_id for t in store.traces(limit=50)} >= {f"s{i}" for i in
                                                                      range(10)}
    finally:
        stop_process(proc, signal.SIGINT, 30)
        router.stop()
    assert slow["status"] == b"200" and max(done) < slow["sent"]  # type: ignore[operator]
    assert got.images[0].byte_size == len(image)


def test_large_images_more_than_the_shared_ring_holds_are_all_recorded(tmp_path: Path
                                                                        ) -> None:
    """Twelve 2 MB image requests at once (24 MB, the ring between the proxy and its recorder
    holds 8): each recorded with its image's size and bytes' hash, whether its bytes went
    through the ring or, with the ring full, the pipe."""
    from concurrent.futures import ThreadPoolExecutor

    from mmlens.layout.hashing import smg_identifier

    router = Served(odd_app(), free_port())
    port, db = free_port(), tmp_path / "tap.db"
    proc = start_tap(port, router.url, db, subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    images = [b"\x89PNG\r\n\x1a\n" + os.urandom(3 << 19) for _ in range(12)]

    def send(i: int) -> int:
        body = {"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {
                "url": "data:image/png;base64," + base64.b64encode(images[i]).decode()}}]}]}
        return httpx.post(url + "/v1/chat/completions", json=body, timeout=30,
                          headers={"x-request-id": f"big{i}"}).status_code

    try:
        wait_until(lambda: httpx.post(url + "/v1/chat/completions", json={}, timeout=1,
                                      headers={"x-request-id": "probe"}).status_code == 200,
                   30, what="tap", ignore=(httpx.HTTPError,))
        with ThreadPoolExecutor(12) as pool:
            assert list(pool.map(send, range(12))) == [200] * 12
        with contextlib.closing(open_store(db, readonly=True)) as store:
            wait_until(lambda: len(store.traces(limit=50)) == 13, 60, 0.1,
                       what="all recorded", ignore=(Exception,))
            got = {i: store.trace(f"big{i}") for i in range(12)}
    finally:
        stop_process(proc, signal.SIGINT, 30)
        router.stop()
    for i, t in got.items():
        assert t is not None and len(t.images) == 1
        assert t.images[0].byte_size == len(images[i])
        assert t.images[0].identities["smg_blake3"] == smg_identifier(images[i])
