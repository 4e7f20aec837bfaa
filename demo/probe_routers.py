"""Probe the real SMG 1.13 and Dynamo 1.6.1 routers: per image size, the count each router
computed (or its refusal / fallback); per multi-part message, the prompt it rendered and the
image identities it forwarded; per processor-config variant, which keys it honoured.

SMG: gRPC router mode in front of one simulated vLLM worker; N = pad ids the worker received,
identities = the `mm_hashes` SMG sent. Dynamo: the frontend (KV router) in front of one
simulated engine that logs the ids it received (`mmlens.demo.probe_engine`); N = the frontend's
`image-token count` log line, outcome = its mm_routing lines.

Run (one router and family at a time; 2 cores are enough, the requests are sequential):
  python -m mmlens.demo.probe_routers --router smg --family qwen3-vl \
      --out tests/fixtures/router_probes
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from blake3 import blake3
from mmlens.demo import probe_plan as plan
from mmlens.demo.cluster import Cluster, ClusterConfig
from mmlens.demo.model_dirs import MODELS, ensure_model_dir
from mmlens.demo.probe_engine import records as engine_records

from mmlens.ingest.dynamo_logs import image_token_counts, model_mm_routing, support_for
from mmlens.ingest.router_logs import parse_line
from mmlens.layout.imageinfo import to_data_url

TIMEOUT = 300.0
VERSIONS = {"smg": "smg 1.13.0 (gRPC router mode, --mm-processing auto)",
            "dynamo": "ai-dynamo 1.6.1 frontend (--router-mode kv)"}


@contextmanager
def model_root(family: str, processor_config: dict[str, Any] | None) -> Iterator[Path]:
    """A model cache holding the family's demo directory, its processor file replaced."""
    root = Path(tempfile.mkdtemp(prefix="mmlens-probe-models-"))
    try:
        folder = ensure_model_dir(family, root)
        if processor_config is not None:
            (folder / MODELS[family].processor_file).write_text(json.dumps(processor_config))
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def chat(router: str, model: str, content: Any, rid: str) -> httpx.Response:
    return httpx.post(f"{router}/v1/chat/completions", timeout=TIMEOUT,
                      headers={"x-request-id": rid},
                      json={"model": model, "max_tokens": 1,
                            "messages": [{"role": "user", "content": content}]})


def refusal(r: httpx.Response) -> dict[str, Any]:
    return {"status": r.status_code, "error_code": r.headers.get("x-smg-error-code"),
            "error": r.text[:400]}


class SmgProbe:
    def __init__(self, family: str, port_base: int, root: Path) -> None:
        self.model = MODELS[family]
        self.pad = self.model.token_id(self.model.core.pad)
        self.cluster = Cluster(ClusterConfig(family=family, workers=1, port_base=port_base,
                                             ready_timeout=90, model_cache=root))

    def __enter__(self) -> SmgProbe:
        info = self.cluster.start()
        self.router, self.worker = info["router"], info["workers"][0]["http"]
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.stop()

    def send(self, content: Any, rid: str) -> tuple[httpx.Response, dict[str, Any] | None]:
        r = chat(self.router, self.model.served_name, content, rid)
        if r.status_code != 200:
            return r, None
        seen = httpx.get(f"{self.worker}/demo/requests?last=1", timeout=30).json()[-1]
        return r, seen

    def count(self, w: int, h: int, seed: int) -> dict[str, Any]:
        data = plan.solid_png(w, h, seed)
        r, seen = self.send([{"type": "image_url", "image_url": {
            "url": to_data_url(data, "PNG")}}, {"type": "text", "text": "Describe."}],
            f"probe-{w}x{h}-{seed}")
        out: dict[str, Any] = {"raw_blake3": blake3(data).hexdigest()}
        if seen is None:
            return {**out, **refusal(r)}
        ids = seen["prompt_ids"]
        return {**out, "status": 200, "n": ids.count(self.pad), "expanded": len(ids),
                "identity": (seen.get("mm_hashes") or [None])[0],
                "placeholder": seen["media"][0] if seen["media"] else None}

    def message(self, shape: Any, tag: str) -> dict[str, Any]:
        r, seen = self.send(plan.message_content(shape), f"probe-msg-{tag}")
        raw = [blake3(b).hexdigest() for b in plan.message_images(shape)]
        if seen is None:
            return {"raw_blake3": raw, **refusal(r)}
        return {"raw_blake3": raw, "status": 200, "rendered_text": seen.get("original_text"),
                "ids": seen["prompt_ids"], "placeholders": seen["media"],
                "identities": seen.get("mm_hashes") or []}


class ProbedDynamo:
    """A DynamoCluster whose engine logs what the frontend sent it."""

    def __init__(self, family: str, port_base: int, root: Path,
                 tokenizer_backend: str | None = None) -> None:
        from mmlens.demo.dynamo_cluster import DynamoCluster, DynamoClusterConfig

        class Cluster_(DynamoCluster):
            def _worker_cmd(self, i: int) -> list[str]:
                cmd = super()._worker_cmd(i)
                return [("mmlens.demo.probe_engine" if c == "mmlens.demo.dynamo_engine" else c)
                        for c in cmd]

        self.model = MODELS[family]
        self.cluster = Cluster_(DynamoClusterConfig(family=family, workers=1,
                                                    port_base=port_base, ready_timeout=120,
                                                    model_cache=root,
                                                    tokenizer_backend=tokenizer_backend))
        self.log_pos = 0
        self.seen = 0

    def __enter__(self) -> ProbedDynamo:
        self.cluster.start()
        self.tokenizer_backend = self.cluster.ready_info()["tokenizer_backend"]
        self.lines()  # skip start-up lines
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.stop()

    def lines(self) -> list[str]:
        text = self.cluster.frontend_log.read_text(errors="replace")
        new, self.log_pos = text[self.log_pos:], len(text)
        return new.splitlines()

    def verdict(self) -> dict[str, Any]:
        text = self.cluster.frontend_log.read_text(errors="replace").splitlines()
        v = support_for(model_mm_routing(text), self.model.served_name)
        return {"exact": v.exact, "spec": v.spec, "reasons": v.reasons} if v else {}

    def engine_record(self) -> dict[str, Any] | None:
        recs = engine_records(self.cluster.workers[0].log_path.read_text(errors="replace"))
        if len(recs) > self.seen:
            self.seen = len(recs)
            return recs[-1]
        return None

    def send(self, content: Any, rid: str) -> dict[str, Any]:
        r = chat(self.cluster.router_url, self.model.served_name, content, rid)
        time.sleep(0.3)  # the frontend's log lines follow the response
        lines = self.lines()
        counts = image_token_counts(lines)
        warnings = []
        built = None
        for line in lines:
            obj = parse_line(line) or {}
            if obj.get("target") == "mm_routing" and obj.get("level") in ("WARN", "ERROR"):
                warnings.append(str(obj.get("message"))[:300])
            if str(obj.get("message", "")).startswith("MmRoutingInfo built"):
                built = obj.get("total_tokens")
        out: dict[str, Any] = {"status": r.status_code, "n": [c.tokens for c in counts],
                               "mm_hash": [c.mm_hash for c in counts],
                               "routing_total_tokens": built, "warnings": warnings}
        if r.status_code != 200:
            out["error"] = r.text[:400]
        else:
            out["prompt_tokens"] = r.json().get("usage", {}).get("prompt_tokens")
        rec = self.engine_record()
        if rec is not None:
            out.update(rendered=len(rec["token_ids"]), routing_len=rec["routing_len"])
        out["_record"] = rec
        return out

    def count(self, w: int, h: int, seed: int) -> dict[str, Any]:
        out = self.send([plan.image_part(w, h, seed), {"type": "text", "text": "Describe."}],
                        f"probe-{w}x{h}-{seed}")
        out.pop("_record")
        return out

    def message(self, shape: Any, tag: str) -> dict[str, Any]:
        out = self.send(plan.message_content(shape), f"probe-msg-{tag}")
        rec = out.pop("_record") or {}
        out.update(ids=rec.get("token_ids"), rendered_text=rec.get("formatted_prompt"),
                   identities=rec.get("mm_hashes"))
        if not isinstance(shape, str):
            out["urls"] = [plan.image_part(*p)["image_url"]["url"] for p in shape
                           if isinstance(p, list)]
        return out


def probe_sizes(p: Any, sizes: Sequence[tuple[int, int]] | Sequence[plan.SizeCase],
                log: str) -> list[dict[str, Any]]:
    out = []
    for i, case in enumerate(sizes):
        kind, w, h = ((case.kind, case.width, case.height) if isinstance(case, plan.SizeCase)
                      else ("fixed", *case))
        t0 = time.monotonic()
        obs = {"kind": kind, "w": w, "h": h, **p.count(w, h, i)}
        print(f"{log} {i + 1}/{len(sizes)} {w}x{h} -> {obs.get('n')} ({obs['status']}, "
              f"{time.monotonic() - t0:.1f}s)", file=sys.stderr, flush=True)
        out.append(obs)
    return out


def run(router: str, family: str, port_base: int, seed: int, scale: float,
        parts: set[str], tokenizer_backend: str | None = None) -> dict[str, Any]:
    model = MODELS[family]

    def probe_cls(family: str, port_base: int, root: Path) -> Any:
        if router == "smg":
            return SmgProbe(family, port_base, root)
        return ProbedDynamo(family, port_base, root, tokenizer_backend)
    out: dict[str, Any] = {"router": router, "version": VERSIONS[router], "family": family,
                           "model_type": model.model_type, "served_name": model.served_name,
                           "config_json": model.config,
                           "processor_config": model.processor_config, "seed": seed}
    with model_root(family, None) as root, probe_cls(family, port_base, root) as p:
        if router == "dynamo":
            out["tokenizer_backend"] = p.tokenizer_backend
            out["mm_routing"] = p.verdict()
        if "counts" in parts:
            out["counts"] = probe_sizes(p, plan.random_sizes(seed, scale=scale), family)
        if "messages" in parts:
            out["messages"] = {tag: {"shape": shape, **p.message(shape, tag)}
                               for tag, shape in plan.MESSAGES.items()}
    if "variants" in parts:
        out["variants"] = {}
        for tag, cfg in plan.VARIANTS.get(family, {}).items():
            with model_root(family, cfg) as root, probe_cls(family, port_base, root) as p:
                out["variants"][tag] = {"processor_config": cfg, "counts": probe_sizes(
                    p, plan.VARIANT_SIZES, f"{family}/{tag}")}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mmlens.demo.probe_routers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--router", choices=["smg", "dynamo"], required=True)
    ap.add_argument("--family", choices=sorted(MODELS), required=True)
    ap.add_argument("--out", type=Path, required=True, help="folder for <router>-<family>.json")
    ap.add_argument("--port-base", type=int, default=23600)
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the size plan (0..1]")
    ap.add_argument("--parts", default="counts,messages,variants")
    ap.add_argument("--tokenizer-backend", help="Dynamo frontend --tokenizer (default: the "
                    "demo's per-family choice); the output name gets a -<backend>-tokenizer "
                    "suffix")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    parts = set(args.parts.split(","))
    suffix = f"-{args.tokenizer_backend}-tokenizer" if args.tokenizer_backend else ""
    path = args.out / f"{args.router}-{args.family}{suffix}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    new = run(args.router, args.family, args.port_base, args.seed, args.scale, parts,
              args.tokenizer_backend)
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**old, **new}, indent=1) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
