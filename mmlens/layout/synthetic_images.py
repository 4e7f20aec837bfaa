"""Synthetic test images (solid, noise, gradient) for the Lab and the inspector's composer."""

from __future__ import annotations

import io
import random


def synthetic_png(kind: str, width: int, height: int, seed: int = 0,
                  rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """``solid``, ``noise`` or ``gradient`` test images; the seed varies noise and tint."""
    from PIL import Image

    if kind == "solid":
        img = Image.new("RGB", (width, height), rgb)
    elif kind == "noise":
        rnd = random.Random(seed)
        img = Image.frombytes("RGB", (width, height),
                              bytes(rnd.getrandbits(8) for _ in range(width * height * 3)))
    elif kind == "gradient":
        img = Image.linear_gradient("L").resize((width, height)).convert("RGB")
        tint = Image.new("RGB", (width, height), rgb)
        img = Image.blend(img, tint, 0.35 + (seed % 5) * 0.1)
    else:
        raise ValueError(f"unknown synthetic image kind {kind!r}")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()
