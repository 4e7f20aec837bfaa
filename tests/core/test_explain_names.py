"""`mmlens explain` names workers as every page does (w1, w2), and says the verdict in one
sentence; its JSON keeps the addresses."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from mmlens.cli import explain
from mmlens.records import RequestTrace, Verdict
from mmlens.store.sqlite import Store

W1, W2 = "grpc://127.0.0.1:50051", "grpc://127.0.0.1:50052"


def _run(db: Path, *args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert explain.main(["--db", str(db), "--request", "r1", *args]) == 0
    return out.getvalue()


def test_explain_names_workers_and_gives_the_cause(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    store = Store(db)
    store.add_traces([RequestTrace("r1", "http://r", "smg", "m", 1.0, False, worker=W2,
                                 status=200, prompt_tokens=329, cached_tokens=0)])
    store.add_verdicts([Verdict(
        "r1", 1.0, "spilled", f"spilled or load-balanced away: {W1} held 10 blocks, the "
        f"router sent it to {W2}, which served 0", worker=W2, predicted_blocks=0,
        realized_blocks=0, better_worker=W1, better_blocks=10,
        evidence={"predicted_worker": W2}, failed_attempts=[
            {"attempt": 1, "worker": W1, "predicted_blocks": 10}])])
    store.set_meta("targets", {"routers": [], "workers": [{"name": "w1", "router_url": W1},
                                                          {"name": "w2", "router_url": W2}]})
    store.close()
    text = _run(db)
    assert "grpc://" not in text and "127.0.0.1" not in text, text
    assert text.splitlines()[0] == ("spilled or load-balanced away: w1 held 10 "
                                    "blocks, the router sent it to w2, which served 0")
    assert text.splitlines()[1].strip().startswith("w1 held 10 of these blocks; the router "
                                                   "chose w2")
    assert "better worker: w1 held 10 blocks" in text
    assert "failed attempt 1: w1 predicted 10 blocks" in text
    assert json.loads(_run(db, "--json"))["better_worker"] == W1
