"""A lone simulated worker's ZMQ KV events in both wire generations, read by the test's own
decoder and by mmlens' collector-side normalizer."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from mmlens.demo.model_dirs import ensure_model_dir

from mmlens.ingest.kv_events import normalize_batch
from mmlens.records import BlockStored
from tests.demo.support import KvSubscriber, decode_payload, image_messages, png_data_url
from tests.live_support import REPO, free_port_base, stop_process

pytestmark = pytest.mark.live


@pytest.fixture(params=["map", "array"])
def worker(request: pytest.FixtureRequest) -> Iterator[dict]:
    base = free_port_base(10)
    cmd = [sys.executable, "-m", "mmlens.demo.worker", "--name", "solo", "--family", "qwen3-vl",
           "--model-dir", str(ensure_model_dir("qwen3-vl")), "--grpc-port", str(base),
           "--http-port", str(base + 1), "--kv-port", str(base + 2),
           "--replay-port", str(base + 3)]
    if request.param == "array":
        cmd.append("--legacy-kv-encoding")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert '"worker_ready"' in line, line
        yield {"encoding": request.param, "http": f"http://127.0.0.1:{base + 1}",
               "kv": f"tcp://127.0.0.1:{base + 2}", "replay": f"tcp://127.0.0.1:{base + 3}"}
    finally:
        stop_process(proc, signal.SIGTERM, 5, group=True)


def test_both_encodings_decode_to_the_same_facts(worker: dict) -> None:
    sub = KvSubscriber(worker["kv"], worker["replay"])
    try:
        body = {"max_tokens": 20, "messages": image_messages(png_data_url(64, 64, (3, 4, 5)))}
        r = httpx.post(worker["http"] + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200
        msgs = sub.recv()
        replayed = sub.replay(0)
    finally:
        sub.close()
    assert [p for _, p in replayed] == [p for _, p in msgs]  # replay from 0 = everything
    payload = msgs[0][1]
    import msgpack

    raw_events = msgpack.unpackb(payload, raw=False)[1]
    if worker["encoding"] == "array":
        assert isinstance(raw_events[0], list) and raw_events[0][0] == "BlockStored"
    else:
        assert isinstance(raw_events[0], dict) and raw_events[0]["type"] == "BlockStored"
    ts, events, rank = decode_payload(payload)
    assert rank == 0 and abs(ts - time.time()) < 60
    stored = events[0]
    prompt = r.json()["usage"]["prompt_tokens"]  # 81
    assert len(stored["block_hashes"]) == prompt // 16
    assert len(stored["token_ids"]) == 16 * len(stored["block_hashes"])
    assert stored["token_ids"].count(151655) == 64
    ident, offset = stored["extra_keys"][0][0]
    assert len(ident) == 64 and offset == 4
    # Decode tokens that fill a block are announced too, chained to the prompt's last block.
    later = [e for _, p in msgs[1:] for e in decode_payload(p)[1] if e["type"] == "BlockStored"]
    assert later and later[0]["parent_block_hash"] == stored["block_hashes"][-1]
    # mmlens' own normalizer reads both generations the same way.
    obj = msgpack.unpackb(payload, raw=False)
    _, _, normalized = normalize_batch(obj, worker="solo", seq=msgs[0][0])
    assert isinstance(normalized[0], BlockStored)
    assert [int(h) if isinstance(h, int) else h for h in normalized[0].block_hashes] == \
        stored["block_hashes"]
