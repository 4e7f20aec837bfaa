"""Where a prompt ends inside a stored block: the one evidence in an engine's KV events of a
request's exact prompt length, without storing a token.

A request whose prompt is not a whole number of blocks fills its last block with its first
generated tokens, and the engine announces that block (one block hung off the prompt's last
full block). A chat prompt ends with the model's generation prompt (Qwen's
``<|im_start|>assistant\\n``): just past its last occurrence in the block is where the prompt
ended, its length modulo the block size. Only that offset is kept (sizes, not text).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from functools import lru_cache


def suffix_bytes(ids: Sequence[int]) -> bytes:
    """The generation prompt's token ids as the index searches them (uint32, native order:
    the order ``array('I')`` holds a block's tokens in)."""
    return array("I", ids).tobytes()


def prompt_end(tokens: Sequence[int], suffix: bytes, block_size: int, opened: int = 0,
               ) -> int | None:
    """Tokens of the block that are the prompt's (1 .. block_size − 1): just past the last
    generation prompt in ``tokens``, or past the part of it the block opens with when it
    began in the previous block; None when the block holds none, or ends with it (a prompt
    of whole blocks: the block is a prompt block, no decode). ``opened``: how many of the
    generation prompt's first tokens end the block it hangs off (``opening``), if any."""
    if not suffix or len(tokens) != block_size:
        return None
    raw = _raw(tokens)
    if raw is None:  # not token ids: no prompt end, the event stays
        return None
    at = raw.rfind(suffix)
    while at > 0 and at % 4:  # a match across token boundaries: look further left
        at = raw.rfind(suffix, 0, at + len(suffix) - 1)
    if at < 0 or at % 4:
        if opened and raw.startswith(suffix[4 * opened:]):
            return len(suffix) // 4 - opened
        return _straddled(raw, suffix)
    end = (at + len(suffix)) // 4
    return end if 0 < end < block_size else None


def opening(tokens: Sequence[int], suffix: bytes) -> int:
    """How many of the generation prompt's first tokens (fewer than all) a block's tokens
    end with: a prompt whose end is in the next block began it here. 0: none."""
    raw = _raw(tokens)
    if raw is None or not suffix:
        return 0
    for j in range(len(suffix) // 4 - 1, 0, -1):
        if raw.endswith(suffix[:4 * j]):
            return j
    return 0


def _raw(tokens: Sequence[int]) -> bytes | None:
    try:
        return tokens.tobytes() if isinstance(tokens, array) and tokens.typecode == "I" \
            else array("I", tokens).tobytes()
    except (OverflowError, TypeError):
        return None


def _straddled(raw: bytes, suffix: bytes) -> int | None:
    """A generation prompt begun in the previous block: the block opens with its last k
    tokens (k >= 2, so that one common token such as a newline is never read as one)."""
    for k in range(len(suffix) // 4 - 1, 1, -1):
        if raw.startswith(suffix[-4 * k:]):
            return k
    return None


@lru_cache(maxsize=16)
def generation_prompt(model: str) -> tuple[int, ...]:
    """The token ids of ``model``'s generation prompt (a family name or a model directory,
    as ``mmlens layout --model`` takes them)."""
    from mmlens.layout.modeldir import resolve_model

    m = resolve_model(model)
    return tuple(m.tokenizer.encode(m.family.chat.assistant_prefix))
