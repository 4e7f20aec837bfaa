"""A recorded request's prompt as the models see it at one block size: the keys of its full
blocks under each view a router or an engine takes of it.

- ``content``: what an engine's prefix cache keys on (vLLM's extra_keys, SGLang's pad values,
  Dynamo's exact MM routing with mm_hash pad values): equal keys, equal tokens and images.
- ``blind``: the expanded ids with every image's run masked (SMG 1.13 router mode: two
  different images of the same token count give the same keys).
- ``unexpanded``: one anchor per image (SMG worker mode, Dynamo's text-prefix fallback): equal
  to ``content`` before the first image; after it, keys of a view no engine stores.

Keys come from the stored layout's per-block keys (``mmlens.whatif.workload.BlockKeys``) at
the recorded block size R; a block size k·R takes every k-th chained key (a chained key names
the whole prefix up to it). Smaller or non-multiple block sizes need the token ids, which
the store does not keep: they are refused. A request without a stored layout gets keys
synthesized from what is known (``synthetic``): its images' identities and token counts, its
text lengths and its prompt length. Requests equal in all of these are assumed to be the same
prompt; nothing of them is assumed shared with any other request.
"""

from __future__ import annotations

from dataclasses import dataclass

import xxhash

from mmlens.whatif.workload import RecordedRequest

_digest = xxhash.xxh3_64_intdigest


class BlockSizeError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Prompt:
    tokens: int  # the engine's prompt length
    output: int  # output tokens (their blocks take cache space, never hit)
    content: tuple[int, ...]
    blind: tuple[int, ...]
    unexpanded: tuple[int, ...]  # empty unless asked for (``prompt``)
    first_image: int | None  # first block an image overlaps
    synthetic: bool  # keys synthesized: no stored layout
    answer: int = 0  # the whole prompt's identity: a deterministic engine answers it alike

    def view(self, name: str) -> tuple[int, ...]:
        return self.content if name == "content" else (
            self.blind if name == "blind" else self.unexpanded)


def _rekeyed(keys: tuple[int, ...], k: int) -> tuple[int, ...]:
    return keys if k == 1 else keys[k - 1::k]


def _unexpanded(content: tuple[int, ...], blind: tuple[int, ...], first: int | None,
                n_blocks: int) -> tuple[int, ...]:
    """Before the first image, the content keys; after it, keys of the anchor view, which
    share a block only with requests whose whole blind prompt is the same (the store has no
    token ids to re-block the anchor view)."""
    if first is None:
        return content
    whole = blind[-1] if blind else 0
    head = min(first, n_blocks)
    return content[:head] + tuple(_digest(b"anchor", whole ^ j) for j in range(head, n_blocks))


def _answer(content: tuple[int, ...], tokens: int) -> int:
    """Equal for prompts of equal full blocks and length (their last partial block, which the
    layouts do not key, is assumed equal too)."""
    return _digest(b"answer", (content[-1] if content else 0) ^ tokens)


def _anchor_blocks(r: RecordedRequest, block_size: int, full: int) -> int:
    if r.rendered_tokens is not None:
        return r.rendered_tokens // block_size
    if r.image_tokens is not None:
        return max(full - (r.image_tokens - len(r.images)) // block_size, 0)
    return full


def prompt(r: RecordedRequest, block_size: int, unexpanded: bool = True) -> Prompt | None:
    """The request at ``block_size`` (None: its prompt length is unknown, so nothing about
    it can be modelled). Without ``unexpanded`` its unexpanded view is left empty (a
    replay whose policy routes on another view has no use for it)."""
    output = r.output_tokens or 0
    if r.keys is not None:
        rb = r.keys.block_size
        if block_size % rb:
            raise BlockSizeError(f"block size {block_size} is not a multiple of the recorded "
                                 f"layouts' block size {rb}: the store keeps no token ids to "
                                 "re-block them")
        k = block_size // rb
        content, blind = _rekeyed(r.keys.content, k), _rekeyed(r.keys.shapes, k)
        first = None if r.keys.first_image_block is None else r.keys.first_image_block // k
        tokens = r.prompt_tokens if r.prompt_tokens is not None else len(r.keys.content) * rb
        view = (_unexpanded(content, blind, first, _anchor_blocks(r, block_size, len(content)))
                if unexpanded else ())
        return Prompt(tokens, output, content, blind, view, first, False,
                      _answer(content, tokens))
    if r.prompt_tokens is None:
        return None
    return _synthetic(r, block_size, output, unexpanded)


def _synthetic(r: RecordedRequest, block_size: int, output: int, unexpanded: bool,
               ) -> Prompt:
    n = r.prompt_tokens // block_size if r.prompt_tokens else 0
    text = ",".join(str(c) for c in r.text_chars) if r.text_chars is not None else "?"
    shape = f"{r.model}|{r.prompt_tokens}|{text}|" + ",".join(
        f"{im.tokens}:{im.width}x{im.height}" for im in r.images)
    ident = "|".join(im.identity or f"unknown:{r.request_id}:{i}"
                     for i, im in enumerate(r.images))
    blind_seed = _digest(shape.encode())
    content_seed = _digest(f"{shape}#{ident}".encode()) if r.images else blind_seed
    blind = tuple(_digest(b"blind", blind_seed ^ j) for j in range(n))
    content = tuple(_digest(b"content", content_seed ^ j) for j in range(n))
    first = 0 if r.images and n else None
    view = (_unexpanded(content, blind, first, _anchor_blocks(r, block_size, n))
            if unexpanded else ())
    return Prompt(r.prompt_tokens or 0, output, content, blind, view, first, True,
                  _answer(content, r.prompt_tokens or 0))
