"""A short warm-up workload for the demo (``python -m mmlens.collectors.warmup``): enough traced
requests that every dashboard page has something to show within a minute, spread over both
workers.

SMG 1.13 routes images on token ids only, so it can tell images apart by size, never by
content, and a request goes wherever most of its token prefix is cached. The warm-up:

1. a text-only request (the router's KV-event index is empty until then);
2. two large images at once through the worker-mode router, which cannot match its
   anchor-only ids against the engines' blocks and places both by load: one per worker, so
   both hold a long image-token prefix (with a single router, through it);
3. image P three times (repeat → cache hits), then Q of P's size (the content-blind false
   hit: SMG predicts P's blocks, the engine finds none);
4. A and B (two sizes) at once, then A again and B again: with equal prefixes on both
   workers the load splits the seeds, and each replay returns to its seed's cache;
5. one request through both routers (router mode, worker mode), a two-image request, streams.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mmlens.collectors.sender import Sender

from mmlens.config import read_ready_file
from mmlens.layout.sent import ImagePart
from mmlens.layout.synthetic_images import synthetic_png
from mmlens.records import RequestTrace
from mmlens.targets_toml import router_name_of

# Long enough that a request's last block holds text (a repeat then beats the same image
# tokens elsewhere), and not the Lab's default text: the Lab's first A and B find only
# image tokens cached on both workers, so the load (not the warm-up) places them.
TEXT = "Look at this picture carefully and tell me everything you can see in it, please."
SEED_TOKENS = 32  # requests sent together stay in flight long enough to see each other


@dataclass(frozen=True)
class Step:
    label: str
    via: str  # "router" (router mode, the first router) | "worker" (worker-mode router)
    requests: tuple[tuple[str, tuple[bytes, ...]], ...]
    together: bool = False
    stream: bool = False


@dataclass
class Outcome:
    traces: list[RequestTrace] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(t.error is not None for t in self.traces)

    @property
    def workers(self) -> list[str]:
        return sorted({t.worker for t in self.traces if t.worker})


def _img(kind: str, w: int, h: int, seed: int, rgb: tuple[int, int, int]) -> bytes:
    return synthetic_png(kind, w, h, seed=seed, rgb=rgb)


def workload() -> list[Step]:
    big = [_img("noise", 1024, 768, s, c) for s, c in ((11, (90, 40, 160)), (12, (40, 150, 90)))]
    p = _img("noise", 320, 240, 21, (200, 30, 30))
    q = _img("noise", 320, 240, 22, (30, 30, 200))  # P's size: the same token ids
    a = _img("noise", 480, 360, 31, (220, 160, 20))
    b = _img("noise", 640, 480, 32, (20, 160, 220))
    r = _img("gradient", 640, 480, 41, (30, 160, 30))
    d = _img("noise", 224, 224, 7, (120, 120, 120))

    def one(*images: bytes, text: str = TEXT) -> tuple[tuple[str, tuple[bytes, ...]], ...]:
        return ((text, images),)

    return [
        Step("text only", "router", one(text="Hello! Say something short about caching.")),
        Step("two large images at once", "worker", (
            (TEXT, (big[0],)), (TEXT, (big[1],))), together=True),
        *[Step(f"P repeat {i + 1}", "router", one(p)) for i in range(3)],
        Step("Q (P's size, other pixels)", "router", one(q)),
        Step("A and B at once", "router", ((TEXT, (a,)), (TEXT, (b,))), together=True),
        Step("A again", "router", one(a)),
        Step("B again", "router", one(b), stream=True),
        Step("R in router mode", "router", one(r)),
        Step("R in worker mode", "worker", one(r)),
        *[Step(f"two images {i + 1}", "router", one(a, d, text="Compare the two images."),
               stream=i == 1) for i in range(2)],
    ]


def router_urls(ready: dict[str, Any]) -> tuple[str, str]:
    """(router-mode URL, worker-mode URL); one router serves both roles when alone."""
    routers = ready.get("routers") or [{"url": ready["router"]}]
    first = routers[0]["url"]
    worker = next((r["url"] for r in routers if r.get("mm_processing") == "worker"), first)
    return first, worker


def run(sender: Sender, ready: dict[str, Any], delay_s: float = 0.2) -> Outcome:
    model = ready["models"][0]
    urls = dict(zip(("router", "worker"), router_urls(ready), strict=True))
    kwargs: dict[str, Any] = {"router_kind": str(ready.get("router_kind", "smg")),
              "layout_model": model.get("family") or model["id"],
              "block_size": int(ready.get("block_size", 16)),
              "keep_text": True}  # mmlens' own fixed prompts, nobody's data
    out = Outcome()
    for step in workload():
        reqs = [(text, [ImagePart(d) for d in images]) for text, images in step.requests]
        # Only a second router is known to run in worker mode (the demo starts it so).
        mode = "worker" if step.via == "worker" and urls["worker"] != urls["router"] else None
        if step.together:
            out.traces += sender.send_together(urls[step.via], model["id"], reqs,
                                               max_tokens=SEED_TOKENS, processing_mode=mode,
                                               **kwargs)
        else:
            for text, images in reqs:
                out.traces.append(sender.send(urls[step.via], model["id"], text, images,
                                              stream=step.stream, processing_mode=mode,
                                              **kwargs))
        time.sleep(delay_s)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mmlens.collectors.warmup", description=__doc__)
    ap.add_argument("--ready-file", required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--delay", type=float, default=0.2, help="seconds between requests")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    ready = read_ready_file(args.ready_file)
    sender = Sender(args.db)
    try:
        out = run(sender, ready, args.delay)
    finally:
        sender.close()
    names = {router_name_of(w): str(w["name"]) for w in ready.get("workers") or []
             if w.get("name")}  # SMG names a worker by URL, Dynamo by its decimal id
    print(f"warm-up: {len(out.traces)} requests, {out.failed} failed, workers "
          f"{', '.join(names.get(w, w) for w in out.workers) or 'none'}", flush=True)
    return 1 if out.failed == len(out.traces) else 0


if __name__ == "__main__":
    sys.exit(main())
