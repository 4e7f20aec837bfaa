"""Layout of a 4-image Qwen3-VL request whose sizes are known (no decode), against the same
counts through transformers' Qwen2-VL image processor (PIL backend) on this machine.

    python benchmarks/layout_bench.py [--repeat 500]
"""

from __future__ import annotations

import argparse
import statistics
import time

from PIL import Image

from mmlens.layout.composition import ImageInput, compose
from mmlens.layout.families import get_family
from mmlens.layout.hashing import dynamo_routing, smg_block_hashes
from mmlens.layout.tokenizers import family_tokenizer

SIZES = [(640, 480), (1280, 720), (224, 224), (1024, 768)]
CONFIG = {"patch_size": 16, "merge_size": 2, "min_pixels": 65536, "max_pixels": 16777216}


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=500)
    args = ap.parse_args()
    fam = get_family("qwen3-vl")
    tok = family_tokenizer("qwen3-vl")
    parts = [ImageInput(*SIZES[0]), ImageInput(*SIZES[1]), "Compare these four images.",
             ImageInput(*SIZES[2]), ImageInput(*SIZES[3])]
    layout = compose(fam, parts, tok, processor_config=CONFIG)
    counts = [im.tokens for im in layout.images]

    lay = timed(lambda: compose(fam, parts, tok, processor_config=CONFIG), args.repeat)
    hashes = timed(lambda: (smg_block_hashes(layout), dynamo_routing(layout, [1, 2, 3, 4])),
                   args.repeat)

    from transformers import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil(**CONFIG)
    images = [Image.new("RGB", s, (120, 40, 200)) for s in SIZES]

    def processor_counts() -> list[int]:
        grids = proc(images=images, return_tensors="np")["image_grid_thw"]
        return [int(t * h * w) // 4 for t, h, w in grids]

    assert processor_counts() == counts, (processor_counts(), counts)
    hf = timed(processor_counts, max(3, args.repeat // 100))
    hf_count_only = timed(
        lambda: [proc.get_number_of_image_patches(h, w, {}) // 4 for w, h in SIZES], args.repeat)

    med = statistics.median
    print(f"request: 4 images {SIZES}, {len(layout.router)} router-view tokens, "
          f"counts {counts}")
    print(f"mmlens layout (render + tokenize + expand + spans): median {med(lay) * 1e3:.3f} ms, "
          f"p95 {sorted(lay)[int(len(lay) * 0.95)] * 1e3:.3f} ms over {len(lay)} runs")
    print(f"mmlens SMG + Dynamo block hashes of that layout: median {med(hashes) * 1e3:.3f} ms")
    print(f"transformers Qwen2VLImageProcessorPil on the 4 images: median {med(hf) * 1e3:.1f} ms "
          f"({med(hf) / med(lay):.0f}x the layout)")
    print(f"transformers get_number_of_image_patches (count only): "
          f"median {med(hf_count_only) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
