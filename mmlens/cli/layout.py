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
from mmlens.layout.modeldir import Model, resolve_model
from mmlens.layout.report import layout_summary, layout_table
from mmlens.layout.router_report import views_summary, views_table
from mmlens.layout.router_views import router_views
from mmlens.layout.routers import DYNAMO_BACKENDS


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
    p.add_argument("--dynamo-tokenizer", choices=DYNAMO_BACKENDS, default="default",
                   help="the Dynamo frontend's --tokenizer backend (Kimi-K3 needs basetenkenizer "
                        "for exact MM routing)")
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
        summary = _summary(model, parts, images, args)
    except LayoutError as exc:
        print(f"mmlens layout: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary))
    else:
        head = layout_table(summary) if "spans" in summary else (
            f"family {summary['family']}  block size {summary['block_size']}  "
            f"tokenizer {summary['tokenizer']}")
        print(head + "\n" + views_table(summary["views"]))
    return 0


def _summary(model: Model, parts: list[Part], images: list[ImageInput],
             args: argparse.Namespace) -> dict[str, Any]:
    """The layout summary plus the per-router views. When the family's own count refuses an
    image (an aspect ratio over 200:1) the views still tell what each party would do."""
    try:
        layout = model.layout(parts, block_size=args.block_size)
    except LayoutError as exc:
        views = router_views(model, parts, block_size=args.block_size,
                             dynamo_backend=args.dynamo_tokenizer)
        print(f"mmlens layout: note: {exc}; the per-router views show each party's outcome",
              file=sys.stderr)
        return {"family": model.family.name, "block_size": args.block_size,
                "tokenizer": model.tokenizer.source,
                "synthetic_tokenizer": model.tokenizer.synthetic, "layout_error": str(exc),
                "views": views_summary(views, args.block_size)}
    summary = layout_summary(layout, model.family, images)
    views = router_views(model, parts, block_size=args.block_size,
                         dynamo_backend=args.dynamo_tokenizer)
    summary["views"] = views_summary(views, args.block_size)
    return summary
