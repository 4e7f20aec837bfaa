import base64
import io

import pytest
from PIL import Image

from mmlens.errors import ImageError
from mmlens.layout.imageinfo import decode_data_url, parse_size, probe_image, to_data_url


def encode(size, fmt="PNG", color=(10, 200, 30)):
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP", "BMP"])
def test_size_and_format_from_bytes(fmt):
    info = probe_image(encode((333, 77), fmt))
    assert (info.width, info.height, info.format) == (333, 77, fmt)


def test_non_image_bytes_are_refused():
    with pytest.raises(ImageError, match="not a readable image"):
        probe_image(b"<html><body>not an image</body></html>")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_images_are_refused(fmt):
    data = encode((640, 480), fmt, color=(1, 2, 3))
    with pytest.raises(ImageError, match=r"truncated|corrupt"):
        probe_image(data[: len(data) // 2])


def test_empty_and_oversize_are_refused():
    with pytest.raises(ImageError, match="empty"):
        probe_image(b"")
    with pytest.raises(ImageError, match="over the 100 byte limit"):
        probe_image(encode((64, 64)), max_bytes=100)


def test_data_url_round_trip():
    data = encode((5, 7))
    url = to_data_url(data, "PNG")
    assert url.startswith("data:image/png;base64,")
    assert decode_data_url(url) == data


@pytest.mark.parametrize("url", [
    "data:image/png,notbase64", "data:image/png;base64,@@@@", "http://x/y.png", "data:",
])
def test_bad_data_urls_are_refused(url):
    with pytest.raises(ImageError):
        decode_data_url(url)


def test_parse_size():
    assert parse_size("640x480") == (640, 480)
    assert parse_size(" 64 × 32 ") == (64, 32)
    for bad in ("640", "0x480", "axb", "99999999x1"):
        with pytest.raises(ImageError):
            parse_size(bad)


def test_data_url_payload_is_base64_of_the_bytes():
    data = encode((3, 3))
    assert to_data_url(data, "PNG").split(",", 1)[1] == base64.b64encode(data).decode()
