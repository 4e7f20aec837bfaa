"""`mmlens check` and `mmlens explain` against the embedded demo (real SMG 1.13, gRPC mode),
driven as a user would: the demo and the CLI as separate processes."""

import contextlib
import json
import signal
import subprocess
import sys

import pytest

from tests.live_support import free_port_base, ready_info, stop_process, wait_until

pytestmark = pytest.mark.live
MODEL = "Qwen/Qwen3-VL-2B-Instruct"


@contextlib.contextmanager
def demo(tmp_path, *extra):
    ready = tmp_path / f"ready-{len(extra)}.json"
    base = free_port_base(50)
    proc = subprocess.Popen([sys.executable, "-m", "mmlens", "demo", "--port-base", str(base),
                             "--ready-file", str(ready), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        yield wait_until(lambda: ready_info(ready, proc), 60, 0.2, what="demo ready")
    finally:
        stop_process(proc, signal.SIGTERM, 30, group=True)


def check(router, *args):
    proc = subprocess.run([sys.executable, "-m", "mmlens", "check", "--router", router,
                           "--kind", "smg", "--model", MODEL, "--json", *args],
                          capture_output=True, text=True, timeout=240)
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def grpc_demo(tmp_path_factory):
    with demo(tmp_path_factory.mktemp("demo")) as info:
        yield info


@pytest.fixture(scope="module")
def worker_demo(tmp_path_factory):
    """Workers that process images themselves and count 8 image tokens more than the router
    (one demo for the URL and the parity test: the drift changes no cache key, so identity
    is judged as without it)."""
    with demo(tmp_path_factory.mktemp("worker-demo"), "--worker-processing", "--count-drift",
              "8") as info:
        yield info


def test_all_scenarios_against_real_smg(grpc_demo, tmp_path):
    db, report = tmp_path / "check.db", tmp_path / "report.html"
    code, out = check(grpc_demo["router"], "--all", "--db", str(db), "--report", str(report),
                      "--media-origin", grpc_demo["media_origin"])
    verdicts = {s["name"]: s for s in out["scenarios"]}
    assert set(verdicts) == {"repeat", "affinity", "isolation", "straddle", "staircase",
                             "identity", "parity"}
    for name in ("repeat", "affinity", "staircase", "straddle", "parity"):
        assert verdicts[name]["verdict"] == "pass", verdicts[name]
    assert code == 0
    # SMG routes on token ids only: B (another image, same size) is predicted as a hit on the
    # worker that holds A, and the engine finds nothing.
    iso = verdicts["isolation"]
    assert iso["verdict"] == "pass"
    assert iso["evidence"]["content_blind_false_hit"] is True
    assert iso["evidence"]["router_predicted_overlap_blocks"] >= 10
    assert iso["evidence"]["b_cached_tokens"] == 0
    # Nobody held B, so nothing was avoidable; what SMG credited A's worker with beyond what
    # it held of B is a content-blind false hit (each request against those before it).
    assert iso["availability"]["avoidable_tokens"] == 0
    assert iso["availability"]["false_hit_tokens"] >= 10 * 16
    assert verdicts["repeat"]["availability"]["avoidable_tokens"] == 0
    # SMG keys engine-side identity by content: the same bytes by URL hit the data-URI seed.
    assert "image content" in verdicts["identity"]["evidence"]["keyed_by"]
    html = report.read_text()
    assert "isolation" in html and "<script" in html

    b = next(r for r in iso["requests"] if r["label"] == "B")
    assert b["explanation"].startswith("false_hit: ")
    proc = subprocess.run([sys.executable, "-m", "mmlens", "explain", "--db", str(db),
                           "--request", b["request_id"], "--json"],
                          capture_output=True, text=True, timeout=60, check=True)
    explanation = json.loads(proc.stdout)
    assert explanation["category"] == "false_hit"
    assert explanation["evidence"]["predicted_blocks"] >= 10
    warm = next(r for r in verdicts["repeat"]["requests"] if r["label"] == "A#2")
    proc = subprocess.run([sys.executable, "-m", "mmlens", "explain", "--db", str(db),
                           "--request", warm["request_id"], "--json"],
                          capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(proc.stdout)["category"] == "hit"


def test_url_scenarios_use_the_demo_media_origin_when_workers_fetch(worker_demo):
    """Workers that fetch images themselves (worker processing) allow only the demo's own
    media origin: `check --media-origin` uploads there and identity passes; without it, the
    workers refuse mmlens' own loopback server and the summary says what to configure."""
    info = worker_demo
    assert info["media_hosts"] == [info["media_origin"].removeprefix("http://")]
    code, out = check(info["router"], "--scenario", "identity", "--media-origin",
                      info["media_origin"])
    (identity,) = out["scenarios"]
    assert code == 0 and identity["verdict"] == "pass", identity
    assert all(r["status"] == 200 for r in identity["requests"])
    # The engine keys images by content: a URL request reused the data-URI seed's blocks
    # (worker-mode SMG places by load, so the other may land elsewhere).
    ev = identity["evidence"]
    assert max(ev["url_cached"], ev["other_url_cached"]) > ev["text_prefix_limit"], ev
    code, out = check(info["router"], "--scenario", "identity")
    (refused,) = out["scenarios"]
    assert refused["verdict"] == "inconclusive"
    assert "is not in the allowed hosts" in refused["summary"]
    assert "the workers refused image URLs from mmlens' own media server" in refused["summary"]
    assert "--media-origin" in refused["summary"]


def test_parity_fails_with_an_explanation_when_workers_drift(worker_demo):
    code, out = check(worker_demo["router"], "--scenario", "parity")
    (parity,) = out["scenarios"]
    assert code == 1 and parity["verdict"] == "fail"
    assert "+8 tokens" in parity["summary"] and "count drift" in parity["summary"]
    row = parity["evidence"]["rows"][0]
    assert row["engine_prompt_tokens"] - row["expected_prompt_tokens"] == 8


def test_unreachable_router_is_a_setup_error():
    proc = subprocess.run([sys.executable, "-m", "mmlens", "check", "--router",
                           "http://127.0.0.1:9", "--model", MODEL, "--all"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unreachable" in proc.stderr


@pytest.mark.dynamo
def test_all_scenarios_against_real_dynamo(tmp_path):
    pytest.importorskip("dynamo.frontend", reason="the Dynamo extra is not installed")
    with demo(tmp_path, "--router", "dynamo") as info:
        proc = subprocess.run([sys.executable, "-m", "mmlens", "check", "--router",
                               info["router"], "--kind", "dynamo", "--model", MODEL, "--all",
                               "--media-origin", info["media_origin"], "--json"],
                              capture_output=True, text=True, timeout=240)
    verdicts = {s["name"]: s for s in json.loads(proc.stdout)["scenarios"]}
    assert proc.returncode == 0, verdicts
    assert all(v["verdict"] == "pass" for v in verdicts.values()), verdicts
    # Dynamo replaces each image's run by a pad value from its hash: no content-blind hit...
    assert verdicts["isolation"]["evidence"]["content_blind_false_hit"] is False
    # Routing is exact: every repeat met its blocks, nothing was avoidable.
    assert all(v["availability"]["avoidable_tokens"] == 0 for v in verdicts.values()), {
        k: v["availability"] for k, v in verdicts.items()}
    # ...and that hash is XXH3-64 of the URL string, so the same bytes by another URL miss.
    assert "URL string" in verdicts["identity"]["evidence"]["keyed_by"]
    workers = {r["worker"] for s in verdicts.values() for r in s["requests"] if "worker" in r}
    assert all(w and w.isdigit() for w in workers)  # nvext.worker_id, Dynamo's instance ids
