"""Issue 21's acceptance measurement: what really happened to every request (the engines'
own per-request log lines and SMG's own routing lines), and what each of mmlens' views
says about it, tallied as right / unknown / wrong.

Truth for one request, judged on the attempt that served it (the last of SMG's dispatches):
an error when the client got one; a false hit when SMG predicted more than one block beyond
what the engine found; a hit when the engine found any block; spilled when a spill gate
fired (the branch ``spill`` or a gate with ``spill: true``) and nothing was found; else cold.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmlens.analysis.routing_table import decision_rows
from mmlens.cli import explain as explain_cli
from mmlens.records import RequestTrace, Verdict
from mmlens.store.reader import StoreReader
from tests.live_support import REPO

BLOCK = 16


@dataclass
class Truth:
    request_id: str
    category: str
    worker: str | None = None  # the router's name of the serving worker
    cached_tokens: int | None = None
    predicted_blocks: int | None = None
    attempts: int = 0
    spilled: bool = False
    failed_over: bool = False


@dataclass
class Sent:
    """What the client saw of one request it sent."""

    request_id: str  # the x-request-id it sent (SMG adopts it as its request id)
    response_id: str | None = None
    error: str | None = None
    stream: bool = False
    nvext: bool = False  # the answer carried Dynamo's nvext (asked by the tap, not the client)


PENDING = "pending"  # no stored verdict yet (null in JSON)


@dataclass
class Tally:
    """A view's verdicts against the truth: right, unknown (no verdict, pending or
    ``unknown``), ambiguous (``hit_or_…``: two readings, the truth among them), wrong."""

    right: int = 0
    unknown: int = 0
    ambiguous: int = 0
    wrong: int = 0
    wrong_examples: list[str] = field(default_factory=list)

    def add(self, rid: str, got: str | None, truth: str) -> None:
        if got == truth:
            self.right += 1
        elif got in (None, "unknown", PENDING):
            self.unknown += 1
        elif got.startswith("hit_or_") and truth in ("hit", got.removeprefix("hit_or_")):
            self.ambiguous += 1
        else:
            self.wrong += 1
            if len(self.wrong_examples) < 6:
                self.wrong_examples.append(f"{rid}: {got} (truth {truth})")

    @property
    def total(self) -> int:
        return self.right + self.unknown + self.ambiguous + self.wrong

    @property
    def definite(self) -> int:
        return self.right + self.wrong


def engine_lines(logs: Iterable[Path], event: str = "request_finished",
                 ) -> dict[str, dict[str, Any]]:
    """Engine request id → the engine's own per-request line (the gRPC engine's
    ``request_finished``, the Dynamo engine's ``request``)."""
    out: dict[str, dict[str, Any]] = {}
    mark = f'{{"event": "{event}"'
    decoder = json.JSONDecoder()
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            # The Dynamo runtime's own log lines share the file and may run into ours.
            at = line.find(mark)
            if at >= 0:
                with contextlib.suppress(ValueError):
                    rec, _ = decoder.raw_decode(line, at)
                    if "cached_tokens" in rec:
                        out[str(rec["request_id"])] = rec
    return out


def smg_dispatches(log: Path) -> dict[str, list[dict[str, Any]]]:
    """SMG request id → its cache traces (``Cache routing dispatch`` evidence), by attempt."""
    out: dict[str, list[dict[str, Any]]] = {}
    for line in log.read_text(errors="replace").splitlines():
        if '"Cache routing dispatch"' not in line:
            continue
        obj = json.loads(line)
        fields = obj.get("fields", obj)
        ev = json.loads(fields["evidence"])
        out.setdefault(str(ev["root_id"]), []).append(ev)
    for evs in out.values():
        evs.sort(key=lambda e: int(e.get("attempt") or 0))
    return out


def _category(predicted: int | None, cached: int, spilled: bool) -> str:
    if predicted is not None and predicted > cached // BLOCK + 1:
        return "false_hit"
    if cached >= BLOCK:
        return "hit"
    return "spilled" if spilled else "cold"


def dynamo_truth(sent: Iterable[Sent], frontend_log: Path,
                 engines: Mapping[str, dict[str, Any]]) -> dict[str, Truth]:
    """Dynamo: the frontend's ``[ROUTING] Best`` lines (the last one is the attempt that
    served; ``migration.is_retry`` marks a retry), joined to the engine's line by Dynamo's
    own request id (the response id is ``chatcmpl-<it>``; the log names the client's
    ``x_request_id`` beside it)."""
    internal: dict[str, str] = {}
    best: dict[str, list[tuple[str, int]]] = {}
    retried: set[str] = set()
    for line in frontend_log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        obj = json.loads(line)
        rid = obj.get("request_id")
        if obj.get("x_request_id") and rid:
            internal[str(obj["x_request_id"])] = str(rid)
        msg = str(obj.get("message", ""))
        if msg.startswith("[ROUTING] Best") and rid:
            best.setdefault(str(rid), []).append((str(obj["worker_id"]),
                                                  int(obj["overlap_blocks"])))
        if obj.get("migration.is_retry") == "true" and rid:
            retried.add(str(rid))
    out: dict[str, Truth] = {}
    for s in sent:
        rid = internal.get(s.request_id, "")
        served = engines.get(rid)
        if s.error is not None or served is None or not best.get(rid):
            out[s.request_id] = Truth(s.request_id, "error", attempts=len(best.get(rid, [])))
            continue
        predicted = best[rid][-1][1]
        cached = int(served["cached_tokens"])
        out[s.request_id] = Truth(s.request_id, _category(predicted, cached, False),
                                  str(served["worker_id"]), cached, predicted,
                                  len(best[rid]), False, rid in retried)
    return out


def _predicted(pred: Mapping[str, Any]) -> int | None:
    if pred.get("overlap_blocks") is not None:
        return int(pred["overlap_blocks"])
    units = pred.get("credited_units", pred.get("matched_units"))
    return None if units is None else int(units) // BLOCK


def smg_truth(sent: Iterable[Sent], dispatches: Mapping[str, list[dict[str, Any]]],
              engines: Mapping[str, dict[str, Any]]) -> dict[str, Truth]:
    out: dict[str, Truth] = {}
    for s in sent:
        evs = dispatches.get(s.request_id, [])
        if s.error is not None or not evs:
            out[s.request_id] = Truth(s.request_id, "error", attempts=len(evs))
            continue
        last = evs[-1]
        sel = last["selections"][0]
        pred = sel.get("prediction") or {}
        served = next((engines[e] for e in last.get("engine_ids") or [] if e in engines), None)
        if served is None:
            out[s.request_id] = Truth(s.request_id, "error", attempts=len(evs))
            continue
        cached = int(served["cached_tokens"])
        predicted = _predicted(pred)
        spilled = pred.get("branch") == "spill" or any(
            g.get("spill") is True for g in sel.get("gates") or [])
        out[s.request_id] = Truth(s.request_id, _category(predicted, cached, spilled),
                                  sel.get("worker"), cached, predicted, len(evs), spilled,
                                  len(evs) > 1)
    return out


def snapshot_verdicts(db: Path) -> dict[str, str]:
    """`mmlens snapshot --json`'s verdict of every listed request, by request id."""
    out = subprocess.run([sys.executable, "-m", "mmlens", "snapshot", "--db", str(db),
                          "--json", "--traces", "100000", "--window", "3600"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    return {t["request_id"]: (t["verdict"] or {}).get("category") or PENDING
            for t in doc["traces"]}


def stored_verdicts(db: Path) -> tuple[list[RequestTrace], dict[str, Verdict]]:
    """Every request of the store and its stored verdict (as the pages read them)."""
    reader = StoreReader(db)
    try:
        traces = reader.recent_traces(100_000)
        return traces, reader.verdicts_for(traces)
    finally:
        reader.close()


def routing_verdicts(db: Path) -> dict[str, str]:
    """The Routing page's table rows (``decision_rows``, what the page renders)."""
    traces, verdicts = stored_verdicts(db)
    return {r["request"]: r["verdict"] for r in decision_rows(traces, verdicts,
                                                              limit=len(traces))}


def explain_verdict(db: Path, rid: str) -> str | None:
    """`mmlens explain --json`'s category (in process: the CLI's own main)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        code = explain_cli.main(["--db", str(db), "--request", rid, "--json"])
    return (json.loads(buf.getvalue())["category"] or PENDING) if code == 0 else None


def inspector_verdicts(db: Path, rids: Iterable[str]) -> dict[str, str | None]:
    """What the Inspector page shows for each request (the stored verdict it reads, as the
    page reads it: ``StoreReader.verdict``; pending when not judged yet)."""
    reader = StoreReader(db)
    try:
        out: dict[str, str | None] = {}
        for rid in rids:
            t = reader.trace(rid)
            if t is None:
                out[rid] = None
            else:
                v = reader.verdict(t.request_id)
                out[t.request_id] = PENDING if v is None else v.category
        return out
    finally:
        reader.close()


def cache_page_verdicts(db: Path) -> dict[str, str]:
    """The Cache page's predicted-vs-realized points (each names its request's verdict; a
    request without a prediction has no point)."""
    from mmlens.figures.cache import predicted_vs_realized_figure

    traces, verdicts = stored_verdicts(db)
    chart = predicted_vs_realized_figure(traces, verdicts)
    return {rid: text.rsplit("\n", 1)[1] for s in chart.series
            for rid, text in zip(s.ids, s.hovers, strict=True)}


def overview_false_hits(db: Path) -> tuple[int, list[str]] | None:
    """The Overview's false-hit alert over every request of the store: how many it counts
    and the requests it names (None: no such alert)."""
    import re

    from mmlens.analysis.overview import alerts
    from mmlens.store.snapshot import build_snapshot

    reader = StoreReader(db)
    try:
        snap = build_snapshot(reader, 3600.0, 100_000, count_kv_events=False, resident=False)
    finally:
        reader.close()
    for a in alerts(snap, snap.traces, snap.generated_at):
        if a.cause == "false_hits":
            n = re.match(r"(\d+) of ", a.message)
            assert n is not None, a.message
            return int(n.group(1)), [r for r in (a.request_id, *a.examples) if r]
    return None


def wait_judged(db: Path, rids: Iterable[str], timeout: float = 60.0) -> int:
    """Wait until the store holds a verdict for every request (the lead collector's job
    judges each once it settled); returns how many are still pending at the timeout."""
    import time

    want = list(rids)
    deadline = time.monotonic() + timeout
    while True:
        reader = StoreReader(db)
        try:
            missing = 0
            for rid in want:
                t = reader.trace(rid)
                missing += t is None or reader.verdict(t.request_id) is None
        finally:
            reader.close()
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(1.0)


def measure(db: Path, truth: Mapping[str, Truth]) -> tuple[dict[str, Tally], list[str]]:
    """Per view, each request's verdict against the truth; and the requests whose views
    disagree with each other."""
    reader = StoreReader(db)
    try:  # the id each request is stored under (Dynamo's own; the client's is an alias)
        stored = {rid: getattr(reader.trace(rid), "request_id", rid) for rid in truth}
    finally:
        reader.close()
    views = {"snapshot": snapshot_verdicts(db), "routing": routing_verdicts(db)}
    views["explain"] = {stored[rid]: explain_verdict(db, rid) for rid in truth}
    views["inspector"] = inspector_verdicts(db, truth)
    points = cache_page_verdicts(db)
    tallies = {name: Tally() for name in views}  # the Cache page: in the agreement only
    disagree = []
    for rid, t in truth.items():
        seen = {name: got.get(stored[rid]) for name, got in views.items()}
        for name, got in seen.items():
            tallies[name].add(rid, got, t.category)
        if stored[rid] in points:  # the Cache page, where it plots the request
            seen["cache"] = points[stored[rid]]
        if len(set(seen.values())) > 1:
            disagree.append(f"{rid}: " + ", ".join(f"{k} {v}" for k, v in seen.items()))
    # The Overview's alert counts the stored false hits and names only such requests.
    false_hits = {stored[rid] for rid in truth
                  if views["snapshot"].get(stored[rid]) == "false_hit"}
    alert = overview_false_hits(db)
    if alert is not None and (alert[0] != len(false_hits) or not set(alert[1]) <= false_hits):
        disagree.append(f"overview false-hit alert {alert} vs stored {len(false_hits)}")
    return tallies, disagree


def table(tallies: Mapping[str, Mapping[str, Tally]], truth: Mapping[str, Truth]) -> str:
    kinds = Counter(t.category for t in truth.values())
    lines = [f"truth over {len(truth)} requests: " + ", ".join(
        f"{k} {n}" for k, n in kinds.most_common()) + f"; failed over "
        f"{sum(t.failed_over for t in truth.values())}, spill gate fired "
        f"{sum(t.spilled for t in truth.values())}",
        f"{'store':<13} {'view':<10} {'right':>6} {'unknown':>8} {'ambiguous':>10} "
        f"{'wrong':>6}"]
    for store, views in tallies.items():
        for view, t in views.items():
            lines.append(f"{store:<13} {view:<10} {t.right:>6} {t.unknown:>8} "
                         f"{t.ambiguous:>10} {t.wrong:>6}")
    return "\n".join(lines)


def ambiguous_reasons(db: Path) -> Counter[str]:
    """The stored two-reading verdicts by their reason, with the counts in it dropped (the
    README's "what stays ambiguous")."""
    import re

    _, verdicts = stored_verdicts(db)
    return Counter(re.sub(r"\d+ requests of \d+ blocks on \S+", "N requests of one length on a "
                          "worker", re.sub(r"on \S+ stored", "on its worker stored", v.reason))
                   for v in verdicts.values() if v.category.startswith("hit_or_") and v.reason)


def swappable(kv_db: Path, tap_db: Path, truth: Mapping[str, Truth]) -> Counter[str]:
    """Why the two-reading verdicts from logs + KV events stay two. ``swappable``: a rival
    on its worker has as many full prompt blocks in the router's log, a run that overlaps
    its own, another image (the tap saw both) and another realized hit (the engines'
    truth): swapping the two requests' roles (who computed the new image's chain, who
    found its prompt cached) fits every log line and KV event as well, where the router's
    log names no image's identity (SMG 1.13 logs each image's size) and the KV events name
    an image's hash but no request. ``alongside``: the verdict's reason is that another
    request stored blocks of its prompt while it ran (an engine stores a block once:
    found or computed too is not in the events). ``other``: the rest."""
    from mmlens.analysis.judgement.attribution import SLACK_S
    from mmlens.analysis.judgement.batch import (
        block_size_of,
        identities_of,
        prompt_of,
        span_of,
        unit_of,
    )

    def by_client(traces: list[RequestTrace]) -> dict[str, RequestTrace]:
        """Keyed by the id the client sent (Dynamo stores its own, the client's an alias)."""
        return {rid: t for t in traces if (rid := next(
            (k for k in (t.request_id, *t.aliases) if k in truth), None)) is not None}

    traces, stored = stored_verdicts(kv_db)
    mine = by_client(traces)
    verdicts = {rid: v for rid, t in mine.items() if (v := stored.get(t.request_id))}
    tapped = by_client(stored_verdicts(tap_db)[0])

    def image(rid: str) -> tuple[str, ...]:
        t = tapped.get(rid)
        return () if t is None else tuple(sorted(v for im in t.images
                                                 for v in im.identities.values()))

    runs = {}
    for rid, t in mine.items():
        bs = block_size_of(t)
        # Only where the router's log names no image's identity can two be swapped.
        if not t.failed and (n := prompt_of(t, bs)) is not None and identities_of(t) is None:
            runs[rid] = (unit_of(t), n // bs, *span_of(t))
    out: Counter[str] = Counter()
    for rid, v in verdicts.items():
        if not v.category.startswith("hit_or_") or rid not in truth:
            continue
        if (v.reason or "").startswith("another request"):
            out["alongside"] += 1
            continue
        if rid not in runs:
            out["other"] += 1
            continue
        unit, blocks, start, end = runs[rid]
        out["swappable" if any(
            o != rid and u == unit and n == blocks and s - SLACK_S <= end + SLACK_S
            and start - SLACK_S <= e + SLACK_S and image(o) != image(rid) and o in truth
            and truth[o].cached_tokens != truth[rid].cached_tokens
            for o, (u, n, s, e) in runs.items()) else "other"] += 1
    return out
