"""`mmlens check`: run scenarios against a live router; exit 0 all pass, 1 any fail,
2 on setup errors (inconclusive counts as a failure only with --strict)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from mmlens.analysis import scenarios as sc
from mmlens.collectors.media_upload import MediaOriginError
from mmlens.collectors.scenario_runner import ScenarioRunner
from mmlens.collectors.trace_sink import TraceSink, store_writer
from mmlens.collectors.verdict_job import VerdictJob
from mmlens.config_values import HTTP, endpoint
from mmlens.errors import ConfigError, LayoutError
from mmlens.records import RequestTrace, Verdict
from mmlens.store.open import open_store


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmlens check", description=__doc__)
    p.add_argument("--router", required=True, help="router base URL")
    p.add_argument("--kind", choices=("smg", "dynamo", "auto"), default="auto")
    p.add_argument("--model", required=True, help="served model name")
    p.add_argument("--model-dir", help="model directory or family for expected layouts "
                   "(default: --model)")
    p.add_argument("--scenario", action="append", choices=sc.NAMES, default=[])
    p.add_argument("--all", action="store_true")
    p.add_argument("--block-size", type=int, help="default: from the router, else 16")
    p.add_argument("--worker-mode-router", help="a second router in worker-processing mode "
                   "(for parity)")
    p.add_argument("--api-key-env", help="environment variable holding the router's API key")
    p.add_argument("--salt", type=int, help="colour salt (default: random per run)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--report", help="write a self-contained HTML report here")
    p.add_argument("--db", help="also record every request's trace in this store")
    p.add_argument("--strict", action="store_true", help="inconclusive also exits 1")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--media-origin", help="upload URL test images here (PUT /media/<sha256>, "
                   "as the demo's media_origin takes them) so workers that fetch only from "
                   "allowed hosts get them; default: a loopback server of mmlens' own, on a "
                   "port picked per run")
    return p.parse_args(list(argv))


def discover_block_size(client: httpx.Client, router: str) -> int | None:
    """SMG /workers labels, else Dynamo's dynamo_frontend_model_kv_cache_block_size."""
    try:
        resp = client.get(router.rstrip("/") + "/workers", timeout=5)
        body = resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        body = None
    if isinstance(body, dict):
        for w in body.get("workers") or []:
            labels = w.get("labels") or {}
            for key in ("kv_block_size", "page_size", "block_size"):
                if str(labels.get(key, "")).isdigit():
                    return int(labels[key])
    try:
        text = client.get(router.rstrip("/") + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("dynamo_frontend_model_kv_cache_block_size"):
            try:
                return int(float(line.rsplit(" ", 1)[1]))
            except ValueError:
                return None
    return None


def avoidable_line(total: dict[str, object]) -> str:
    """One scenario's avoidable prefill tokens (from its own request history)."""
    if not total.get("requests"):
        return "avoidable: no request with a layout"
    causes = total.get("causes") or {}
    why = ", ".join(f"{c} {n}" for c, n in causes.items()) if isinstance(causes, dict) else ""
    return (f"avoidable {total['avoidable_tokens']} of {total['available_tokens']} available "
            f"tokens" + (f" ({why})" if why else "") +
            (f"; false hits {total['false_hit_tokens']} tokens" if total.get("false_hit_tokens")
             else ""))


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    names = list(sc.NAMES) if args.all or not args.scenario else args.scenario
    from mmlens.layout.modeldir import resolve_model

    try:
        model = resolve_model(args.model_dir or args.model)
    except LayoutError as exc:
        print(f"mmlens check: {exc}", file=sys.stderr)
        return 2
    try:
        origin = endpoint(args.media_origin, "--media-origin", HTTP)
    except ConfigError as exc:
        print(f"mmlens check: {exc}", file=sys.stderr)
        return 2
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    client = httpx.Client(timeout=args.timeout)
    try:
        client.get(args.router.rstrip("/") + "/v1/models", timeout=5)
    except httpx.HTTPError as exc:
        print(f"mmlens check: router {args.router} is unreachable: {exc}", file=sys.stderr)
        return 2
    block = args.block_size or discover_block_size(client, args.router) or 16
    ctx = sc.Context(block_size=block, model_family=model.family.name,
                     count_of=lambda w, h: model.family.image_token_count(
                         w, h, model.processor_config))
    salt = args.salt if args.salt is not None else random.randrange(256)

    def progress(what: str, done: int, total: int) -> None:
        if not args.json:
            print(f"  {what} ({done}/{total})", file=sys.stderr)

    # Every request's trace goes through the sink into the store (--db, else one of the
    # check's own); the scenarios' prompts are mmlens' own, so their text is kept for the
    # inspector's full rebuild. The verdict job judges them there, as a collector would.
    with contextlib.ExitStack() as stack:
        db = args.db or str(Path(stack.enter_context(tempfile.TemporaryDirectory()))
                            / "check.db")
        sink = TraceSink(store_writer(db), layout_model=args.model_dir or args.model,
                         block_size=block, keep_text=True)
        store = open_store(db)
        stack.callback(store.close)
        job = VerdictJob(store)

        def verdicts(traces: Sequence[RequestTrace]) -> Mapping[str, Verdict]:
            job.catch_up()
            return store.verdicts_for([t.request_id for t in traces])

        runner = ScenarioRunner(client, args.router, args.model, router_kind=args.kind,
                                sink=sink, worker_mode_router_url=args.worker_mode_router,
                                api_key=api_key, progress=progress, media_origin=origin,
                                verdicts=verdicts)
        plans = {s.name: s for s in sc.build(ctx, salt)}
        try:
            results = [runner.run(plans[name], ctx) for name in names]
        except MediaOriginError as exc:
            print(f"mmlens check: {exc}", file=sys.stderr)
            return 2
    meta = {"router": args.router, "kind": args.kind, "model": args.model,
            "family": model.family.name, "block size": str(block), "salt": str(salt),
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    if args.report:
        from mmlens.figures.report_html import render

        with open(args.report, "w") as fh:
            fh.write(render(results, f"mmlens check — {args.model}", meta))
    if args.json:
        print(json.dumps({"meta": meta, "scenarios": [r.as_json() for r in results]},
                         default=str))
    else:
        for r in results:
            print(f"{r.verdict.upper():<13} {r.name:<10} {r.summary}")
            print(f"{'':<24}{avoidable_line(r.availability)}")
    if any(r.verdict == "fail" for r in results):
        return 1
    if args.strict and any(r.verdict == "inconclusive" for r in results):
        return 1
    return 0
