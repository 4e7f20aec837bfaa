"""`mmlens layout`: the token layout of one chat request for a model family or directory."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmlens.errors import LayoutError
from mmlens.layout.composition import ImageInput, Part
from mmlens.layout.imageinfo import (
    MAX_IMAGE_BYTES,
    SIZE_RE,
    decode_data_url,
    parse_size,
    probe_image,
    to_data_url,
)
from mmlens.layout.modeldir import resolve_model
from mmlens.layout.report import layout_summary, layout_table


class AppendPart(argparse.Action):
    """Keeps --image and --text in the order given: that is the message's order."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        parts = getattr(namespace, "parts", None) or []
        parts.append((self.dest, values))
        namespace.parts = parts


def fetch_url(url: str, timeout: float = 10.0) -> bytes:
    import httpx

    with httpx.Client(timeout=timeout, follow_redirects=True) as client, client.stream(
        "GET", url
    ) as resp:
        if resp.status_code != 200:
            raise LayoutError(f"fetching {url} gave HTTP {resp.status_code}")
        chunks, size = [], 0
        for chunk in resp.iter_bytes():
            size += len(chunk)
            if size > MAX_IMAGE_BYTES:
                raise LayoutError(f"{url} is over the {MAX_IMAGE_BYTES} byte limit")
            chunks.append(chunk)
    return b"".join(chunks)


def image_from_arg(arg: str) -> ImageInput:
    if SIZE_RE.match(arg):
        width, height = parse_size(arg)
        return ImageInput(width, height)
    if arg.startswith("data:"):
        data, url = decode_data_url(arg), arg
    elif arg.startswith(("http://", "https://")):
        data, url = fetch_url(arg), arg
    else:
        path = Path(arg)
        if not path.is_file():
            raise LayoutError(f"--image {arg!r} is neither WxH, a URL, nor a file")
        data = path.read_bytes()
        url = None
    info = probe_image(data)
    return ImageInput(info.width, info.height, data=data,
                      url=url or to_data_url(data, info.format), format=info.format)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mmlens layout", description=__doc__)
    p.add_argument("--model", required=True, help="family name, model id or model directory")
    p.add_argument("--image", action=AppendPart, help="WxH, an image file, or a URL")
    p.add_argument("--text", action=AppendPart, help="text part of the message")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(list(argv))
    if not getattr(args, "parts", None):
        args.parts = []
    return args


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    try:
        model = resolve_model(args.model)
        parts: list[Part] = []
        images: list[ImageInput] = []
        for kind, value in args.parts:
            if kind == "image":
                img = image_from_arg(value)
                images.append(img)
                parts.append(img)
            else:
                parts.append(value)
        layout = model.layout(parts, block_size=args.block_size)
    except LayoutError as exc:
        print(f"mmlens layout: {exc}", file=sys.stderr)
        return 2
    summary = layout_summary(layout, model.family, images)
    print(json.dumps(summary) if args.json else layout_table(summary))
    return 0
