"""Re-judge a kept run of the verdict acceptance test offline, to change the judgement
without rerunning the live test.

A run's directory (``pytest --basetemp=DIR``: ``DIR/smg-production0``) holds the stores, the
router's and the engines' logs and ``sent.json``. The log + KV events store is copied, its
verdicts deleted, and the verdict job run over the copy stepping ``now`` every 5 s from the
first request to past the last, as the lead collector's ticks did; every verdict is then
scored against the truth read from the logs, beside the verdicts the live job stored.

Usage: python -m tests.observed.rejudge RUN_DIR [RUN_DIR ...] [--store logs+kv] [--show N]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from mmlens.collectors.verdict_job import VerdictJob

from mmlens.store.open import open_store
from mmlens.store.reader import StoreReader
from tests.observed.acceptance import (
    Sent,
    Tally,
    Truth,
    dynamo_truth,
    engine_lines,
    smg_dispatches,
    smg_truth,
)

STEP_S = 5.0
T = TypeVar("T")


def truth_of(run: Path) -> dict[str, Truth]:
    """The engines' and the router's own account of every request the client sent."""
    sent = [Sent(**x) for x in json.loads((run / "sent.json").read_text())]
    logs = run / "logs"
    workers = sorted(logs.glob("worker-w*.log"))
    if (logs / "smg.log").exists():
        return smg_truth(sent, smg_dispatches(logs / "smg.log"), engine_lines(workers))
    return dynamo_truth(sent, logs / "frontend.log", engine_lines(workers, "request"))


def _verdicts(db: Path) -> dict[str, str]:
    con = sqlite3.connect(db)
    try:
        return dict(con.execute("SELECT request_id, category FROM verdicts"))
    finally:
        con.close()


def _aliases(db: Path, rids: Iterable[str]) -> dict[str, str]:
    """The client's request id → the id its trace is stored under (Dynamo keeps its own)."""
    reader = StoreReader(db)
    try:
        return {rid: getattr(reader.trace(rid), "request_id", rid) for rid in rids}
    finally:
        reader.close()


def rejudge(db: Path, settle_s: float = 12.0,
            read: Callable[[Path], T] = _verdicts) -> T:  # type: ignore[assignment]
    """Every request of a copy of ``db`` judged again by the verdict job, tick by tick;
    ``read`` reads the copy's verdicts (default: request id → category)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / db.name
        src = sqlite3.connect(db)
        dst = sqlite3.connect(copy)
        src.backup(dst)  # the WAL's rows too
        src.close()
        dst.execute("DELETE FROM verdicts")
        dst.commit()
        lo, hi = dst.execute("SELECT min(ts), max(ts) FROM traces").fetchone()
        dst.close()
        store = open_store(copy)
        try:
            job = VerdictJob(store, settle_s=settle_s, horizon_s=1e9)
            now = lo
            while now <= hi + settle_s + 4 * STEP_S:
                job.run(now)
                now += STEP_S
            job.catch_up(hi + 3600)
        finally:
            store.close()
        return read(copy)


def score(got: Mapping[str, str], truth: Mapping[str, Truth],
          alias: Mapping[str, str]) -> Tally:
    tally = Tally()
    for rid, t in truth.items():
        tally.add(rid, got.get(alias.get(rid, rid)), t.category)
    return tally


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--store", default="logs+kv")
    p.add_argument("--show", type=int, default=10, help="changed requests to list")
    args = p.parse_args(argv)
    for run in args.runs:
        db = run / f"{args.store}.db"
        truth = truth_of(run)
        alias = _aliases(db, truth)
        stored, again = _verdicts(db), rejudge(db)
        print(f"{run.name}: {len(truth)} requests")
        for name, got in (("stored", stored), ("re-judged", again)):
            t = score(got, truth, alias)
            print(f"  {name:9}  right {t.right}  unknown {t.unknown}  ambiguous "
                  f"{t.ambiguous}  wrong {t.wrong}  definite {t.definite / len(truth):.1%}"
                  f"  {t.wrong_examples}")
        changed = [rid for rid in truth if stored.get(alias.get(rid, rid)) !=
                   again.get(alias.get(rid, rid))]
        print(f"  changed {len(changed)}: " + ", ".join(
            f"{rid} {stored.get(alias.get(rid, rid))}->{again.get(alias.get(rid, rid))} "
            f"(truth {truth[rid].category})" for rid in changed[:args.show]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
