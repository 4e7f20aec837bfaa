"""Synthetic prompt text of a recorded length, for requests whose text was not stored.

A recorded request keeps its token counts, not its words (privacy), so a replay writes words
of its own: drawn from a fixed list by a generator seeded with the request's text identity
(the same identity always gives the same words, a different one other words), as many as it
takes for the laid-out prompt to have the recorded number of tokens. The count is checked
on the model's own layout (chat template, tokenizer, image-token counts), so template tokens
and images are accounted for as the router and the engine count them.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from mmlens.errors import LayoutError
from mmlens.layout.composition import ImageInput
from mmlens.layout.modeldir import Model

# Common words, each one token with a leading space in the Qwen3 vocabulary; with another
# tokenizer the fit below still lands on the count, taking more or fewer words.
WORDS = tuple("""
apple river stone cloud garden window music paper silver orange forest engine market winter
summer island bridge castle rocket planet valley mirror candle letter pocket shadow thunder
camera button cotton dragon table chair house water light night money story point world
school family group country problem number company system program question government
moment office power change minute member party health person history result morning
reason research girl guy food teacher body level father mother street idea kind
friend city community name team ocean face state month book head wall door field
""".split())
MAX_SHIFTS = 16

Count = Callable[[str], int]


@dataclass(frozen=True, slots=True)
class FittedText:
    text: str
    tokens: int  # the laid-out prompt's length with this text
    exact: bool  # tokens == the length asked for


def words_for(key: str, n: int, last: int = 0) -> str:
    """The first ``n`` words of ``key``'s sequence (each a prefix of the next); ``last``
    shifts the final word along the list (to land on a length a word's split missed)."""
    rnd = random.Random(hashlib.sha256(key.encode()).digest())
    picks = [rnd.randrange(len(WORDS)) for _ in range(n)]
    if picks and last:
        picks[-1] = (picks[-1] + last) % len(WORDS)
    return " ".join(WORDS[i] for i in picks)


def fit_words(key: str, target: int, count: Count) -> FittedText:
    """Words of ``key`` whose prompt (``count`` of a text) is ``target`` tokens long, or the
    closest found when no number of words lands on it exactly. A prompt grows with every
    word, so the fewest words reaching ``target`` are found by bisection."""
    seen: dict[int, int] = {}

    def length(n: int) -> int:
        if n not in seen:
            seen[n] = count(words_for(key, n))
        return seen[n]

    lo, hi = 0, max(target - length(0), 1)  # with one token a word, hi is the answer
    while length(hi) < target:
        lo, hi = hi, 2 * hi
    while lo < hi:  # the fewest words with length >= target
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if length(mid) < target else (lo, mid)
    if length(lo) != target and lo > 0:
        for shift in range(1, MAX_SHIFTS + 1):  # another last word may split differently
            text = words_for(key, lo, shift)
            if count(text) == target:
                return FittedText(text, target, True)
    n = min((lo, lo - 1) if lo > 0 else (lo,), key=lambda k: abs(length(k) - target))
    return FittedText(words_for(key, n), length(n), length(n) == target)


class TextFitter:
    """Fits text for one model: the prompt length is the model's router-view length (the
    expanded prompt, what the engine counts) with the request's images before the text, as
    mmlens sends them."""

    def __init__(self, model: Model, block_size: int = 16) -> None:
        self.model = model
        self.block_size = block_size
        self._fit = lru_cache(maxsize=4096)(self._fit_uncached)

    def prompt_tokens(self, text: str, images: Sequence[tuple[int, int]]) -> int:
        parts: list[ImageInput | str] = [ImageInput(w, h) for w, h in images]
        layout = self.model.layout([*parts, text], block_size=self.block_size)
        return len(layout.router)

    def fit(self, key: str, target: int, images: Sequence[tuple[int, int]]) -> FittedText:
        """Raises ``LayoutError`` when the model refuses the images."""
        return self._fit(key, target, tuple(images))

    def _fit_uncached(self, key: str, target: int,
                      images: tuple[tuple[int, int], ...]) -> FittedText:
        return fit_words(key, target, lambda text: self.prompt_tokens(text, images))


__all__ = ["FittedText", "LayoutError", "TextFitter", "fit_words", "words_for"]
