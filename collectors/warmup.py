"""A short warm-up workload for the demo (``python -m mmlens.collectors.warmup``): enough traced
requests that every dashboard page has something to show within a minute.

Sequence: image A ×3 (repeat → cache hits), B of A's size (content-blind false hit on SMG's
gRPC router), A B A B (affinity), a 640×480 gradient ×2, a two-image request ×2, streams.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from mmlens.collectors.sender import Sender

from mmlens.config import read_ready_file
from mmlens.layout.sent import ImagePart
from mmlens.layout.synthetic_images import synthetic_png

TEXT = "Describe this image in detail please."


def workload() -> list[tuple[str, list[bytes], bool]]:
    a = synthetic_png("solid", 64, 64, rgb=(200, 30, 30))
    b = synthetic_png("solid", 64, 64, rgb=(30, 30, 200))
    c = synthetic_png("gradient", 640, 480, seed=1, rgb=(30, 160, 30))
    d = synthetic_png("noise", 224, 224, seed=7)
    steps = [(TEXT, [a], False)] * 3 + [(TEXT, [b], False)]
    steps += [(TEXT, [a], False), (TEXT, [b], True)] * 2
    steps += [("What is in this picture?", [c], False), ("What is in this picture?", [c], True)]
    steps += [("Compare the two images.", [a, d], False)] * 2
    return steps


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mmlens.collectors.warmup", description=__doc__)
    ap.add_argument("--ready-file", required=True)
    ap.add_argument("--db", required=True)
    ap.add_argument("--delay", type=float, default=0.2, help="seconds between requests")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    ready = read_ready_file(args.ready_file)
    model = ready["models"][0]
    sender = Sender(args.db)
    failures = 0
    try:
        for text, images, stream in workload():
            trace = sender.send(ready["router"], model["id"], text,
                                [ImagePart(data) for data in images],
                                router_kind=str(ready.get("router_kind", "smg")),
                                layout_model=model.get("family") or model["id"],
                                block_size=int(ready.get("block_size", 16)), stream=stream,
                                keep_text=True)  # mmlens' own fixed prompts, nobody's data
            failures += trace.error is not None
            time.sleep(args.delay)
    finally:
        sender.close()
    print(f"warm-up: {len(workload())} requests, {failures} failed", flush=True)
    return 1 if failures == len(workload()) else 0


if __name__ == "__main__":
    sys.exit(main())
