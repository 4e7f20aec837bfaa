"""Header-only image sizes agree with PIL's full probe, and say nothing when unsure."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from mmlens.layout.image_header import header_size
from mmlens.layout.imageinfo import probe_image


def encoded(fmt: str, w: int, h: int, **kw: object) -> bytes:
    img = Image.radial_gradient("L").resize((w, h)).convert("RGB")
    out = io.BytesIO()
    (img.convert("P") if fmt == "GIF" else img).save(out, fmt, **kw)
    return out.getvalue()


@pytest.mark.parametrize("fmt,kw", [("PNG", {}), ("JPEG", {}), ("JPEG", {"progressive": True}),
                                    ("GIF", {}), ("WEBP", {}), ("WEBP", {"lossless": True}),
                                    ("BMP", {})])
@pytest.mark.parametrize("w,h", [(123, 45), (45, 123), (2048, 1536)])
def test_header_size_matches_the_full_probe(fmt: str, kw: dict, w: int, h: int) -> None:
    data = encoded(fmt, w, h, **kw)
    probed = probe_image(data)
    assert header_size(data) == (probed.width, probed.height) == (w, h)


def test_truncated_or_unknown_images_are_left_to_the_full_probe() -> None:
    png, jpeg = encoded("PNG", 64, 32), encoded("JPEG", 64, 32)
    assert header_size(png[: len(png) // 2]) is None
    assert header_size(jpeg[: len(jpeg) // 2]) is None
    assert header_size(b"not an image") is None and header_size(b"") is None
    assert header_size(encoded("PNG", 1, 1)[:24] + b"IEND") is None or True  # no crash
