"""Probe the real SMG router's image-token counts and processing decisions per demo model.

For each model: a one-worker cluster in router mode; one chat request per image size; the
worker's record of what it received gives N (pad ids counted) and, for Kimi-K3, the whole
expanded block. A second cluster whose worker advertises `mm_processor` shows which models
SMG lets workers expand (`smg_mm_processing_total{mode,reason}`).

Run: python -m mmlens.demo.probe_counts --out tests/fixtures/smg_observed_counts.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from mmlens.demo.cluster import Cluster, ClusterConfig
from mmlens.demo.model_dirs import MODELS

from mmlens.layout.imageinfo import to_data_url
from mmlens.layout.synthetic_images import synthetic_png

SIZES = ["64x64", "100x100", "224x224", "300x1000", "640x480", "1000x700", "1024x768",
         "1280x720", "1920x1080", "4000x3000", "17x29", "2000x50"]
TEXT = "Describe this image in detail please."


def png_data_url(width: int, height: int, seed: int = 0) -> str:
    color = ((37 * seed + 90) % 256, (91 * seed + 30) % 256, (53 * seed + 160) % 256)
    return to_data_url(synthetic_png("solid", width, height, rgb=color), "PNG")


def chat_body(model: str, url: str, text: str = TEXT, max_tokens: int = 1) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}]}


def mm_processing_samples(metrics_text: str) -> list[dict[str, Any]]:
    out = []
    for m in re.finditer(r'^smg_mm_processing_total\{([^}]*)\} (\S+)$', metrics_text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        out.append({**labels, "value": float(m.group(2))})
    return out


def _last_request(worker_http: str) -> dict[str, Any]:
    return httpx.get(f"{worker_http}/demo/requests?last=1", timeout=10).json()[-1]


def probe_router_mode(family: str, port_base: int, sizes: Sequence[str]) -> dict[str, Any]:
    model = MODELS[family]
    pad = model.token_id(model.core.pad)
    result: dict[str, Any] = {
        "model_type": model.model_type,
        "served_name": model.served_name,
        "processor_file": model.processor_file,
        "processor_config": model.processor_config,
        "config_json": model.config,
        "pad_token_id": pad,
        "counts": {},
        "expanded_lengths": {},
    }
    with Cluster(ClusterConfig(family=family, workers=1, port_base=port_base,
                               ready_timeout=40)) as c:
        info = c.ready_info()
        worker_http = info["workers"][0]["http"]
        for i, size in enumerate(sizes):
            w, h = (int(v) for v in size.split("x"))
            r = httpx.post(info["router"] + "/v1/chat/completions",
                           json=chat_body(model.served_name, png_data_url(w, h, i)), timeout=300)
            if r.status_code != 200:
                result["counts"][size] = None
                result.setdefault("errors", {})[size] = f"{r.status_code} {r.text[:300]}"
                continue
            seen = _last_request(worker_http)
            ids = seen["prompt_ids"]
            result["counts"][size] = ids.count(pad)
            result["expanded_lengths"][size] = len(ids)
            if family == "kimi-k3" and size == "640x480":
                start = ids.index(model.token_id("<|media_begin|>"))
                end = ids.index(model.token_id("<|media_end|>"))
                result["expanded_example"] = {
                    "image": size,
                    "text": TEXT,
                    "original_text": seen.get("original_text"),
                    "prompt_ids": ids if len(ids) < 600 else None,
                    "media_block_without_pads": [t for t in ids[start : end + 1] if t != pad],
                    "media_block_offset": start,
                    "media_block_length": end + 1 - start,
                    "mm_placeholders": seen["media"],
                }
            if size == "640x480":
                result["mm_placeholders_640x480"] = seen["media"]
        metrics = httpx.get(info["router_metrics"], timeout=10).text
        result["smg_mm_processing_router_mode_auto"] = mm_processing_samples(metrics)
    return result


def probe_worker_mode(family: str, port_base: int) -> dict[str, Any]:
    model = MODELS[family]
    with Cluster(ClusterConfig(family=family, workers=1, port_base=port_base,
                               worker_mm_processor=True, ready_timeout=40)) as c:
        info = c.ready_info()
        r = httpx.post(info["router"] + "/v1/chat/completions",
                       json=chat_body(model.served_name, png_data_url(640, 480)), timeout=60)
        seen = _last_request(info["workers"][0]["http"])
        metrics = httpx.get(info["router_metrics"], timeout=10).text
        return {"status": r.status_code, "worker_received_media_refs": seen.get("media_refs", 0),
                "smg_mm_processing_total": mm_processing_samples(metrics)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mmlens.demo.probe_counts", description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--port-base", type=int, default=21500)
    p.add_argument("--families", default="glm-5.3-flash,kimi-k3,qwen3-vl")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    out: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    out["_about"] = ("Observed with smg 1.13.0 gRPC router mode (auto, worker not advertising "
                     "mm_processor): N = pad ids the simulated vLLM worker received per image "
                     "(solid-colour PNG data URLs, one image per request). Regenerate with "
                     "`python -m mmlens.demo.probe_counts --out "
                     "tests/fixtures/smg_observed_counts.json`.")
    for k, family in enumerate(args.families.split(",")):
        entry = probe_router_mode(family, args.port_base + 100 * k, SIZES)
        entry["worker_mode_probe"] = probe_worker_mode(family, args.port_base + 100 * k + 50)
        out[family] = entry
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
        print(family, entry["counts"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
