"""A request's exact prompt length where a router's own count of it gives one."""

from __future__ import annotations

from mmlens.ingest.observed import known
from mmlens.records import RequestTrace


def dynamo_prompt(t: RequestTrace) -> int | None:
    """The prompt Dynamo sent its engine: its ``input_tokens`` (the rendered prompt, one
    placeholder per image) with each image's token count in place of its placeholder. On
    1,939 requests of nine live runs (Dynamo 1.6.1, Qwen3-VL) equal to the engine's own count
    every time; its ``total_tokens`` is that count rounded up to whole blocks. None where an
    image's count is unknown, or where Dynamo routed the request more than once (a migration
    resends the prompt with the tokens generated so far)."""
    if t.router_kind != "dynamo" or t.rendered_tokens is None \
            or not known(t, "rendered_tokens"):
        return None
    if sum(1 for p in t.predictions if p.request_blocks is not None) > 1:
        return None
    tokens = [im.tokens for im in t.images]
    if any(n is None for n in tokens):
        return None
    return int(t.rendered_tokens) - len(tokens) + sum(int(n) for n in tokens if n is not None)
