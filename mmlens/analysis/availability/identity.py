"""Which identifier an engine gives each image, learned from the blocks a request stored.

mmlens names an image by its content (the blake3 of its bytes, or its URL); an engine by its
own identifier in ``extra_keys`` (vLLM: a hash of the decoded pixels and the model; behind
Dynamo: the frontend's mm_hash; SMG in router mode: its own blake3). The shape keys of a
request's blocks need no identity, so the image blocks the served worker stored while the
request ran, at the request's shape key and image offset, name the request's image as the
engine does. One image learned is every later request with those bytes resolved.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from mmlens.layout.content_keys import BlockShapes, canonical_offset
from mmlens.records import BlockStored, ImageRef

MAX_VARIANTS = 3

Refs = tuple[ImageRef, ...]
ImageBlock = tuple[int, int, Refs]
"""A stored image block: its shape key, content key and image refs."""


def image_blocks(ev: BlockStored) -> list[ImageBlock]:
    """The image blocks of a stored event whose content keys the resident index computed."""
    if not ev.images or not ev.shapes or not ev.keys:
        return []
    return [(shape, key, tuple(refs)) for shape, key, refs in zip(
        ev.shapes, ev.keys, ev.images, strict=False) if refs]


class EngineIdentities:
    def __init__(self, horizon_s: float = 900.0) -> None:
        self.horizon_s = horizon_s
        self.aliases: dict[str, list[str]] = {}  # content identity → engine identifiers
        self._owner: dict[str, str] = {}  # engine identifier → content identity
        # image block shape → (ts, unit, image refs, content key) of recent stores
        self._recent: dict[int, list[tuple[float, str, Refs, int]]] = {}
        self._expiry: deque[tuple[float, int]] = deque()
        self.learned = 0  # names learned so far: more can tell an earlier request's apart

    def stored(self, ts: float, unit: str, images: Sequence[ImageBlock]) -> None:
        """Remember the image blocks of one ``BlockStored`` event (by shape key)."""
        for shape, key, refs in images:
            self._recent.setdefault(shape, []).append((ts, unit, tuple(refs), key))
            self._expiry.append((ts, shape))
        cutoff = ts - self.horizon_s
        while self._expiry and self._expiry[0][0] < cutoff:
            old, shape = self._expiry.popleft()
            kept = [e for e in self._recent.get(shape, ()) if e[0] > old]
            if kept:
                self._recent[shape] = kept
            else:
                self._recent.pop(shape, None)

    def learn(self, unit: str, since: float, until: float, shapes: BlockShapes,
              content_ids: Sequence[str], held_before: Callable[[int], bool],
              slack_s: float = 0.0) -> dict[int, str]:
        """Engine identifiers of a request's images from what ``unit`` stored between
        ``since`` and ``until`` (the request's service) that it did not hold before the
        request (``held_before(content key)``); returns those newly learned. Stores up to
        ``slack_s`` outside the service (the engine's clock may differ) count only when the
        service itself names no image, or more than one: an engine that stores a prompt's
        blocks when it allocates them stores the next request's right after this one ends."""
        learned: dict[int, str] = {}
        firsts = shapes.first_blocks()
        for index, content in enumerate(content_ids):
            b = firsts.get(index)
            if b is None:
                continue
            offset = canonical_offset(next(off for i, off in shapes.images[b] if i == index))
            stores = [(ts, name) for ts, u, refs, key in self._recent.get(shapes.shapes[b], ())
                      if u == unit and since - slack_s <= ts <= until + slack_s
                      and not held_before(key)
                      for name, off in refs if canonical_offset(off) == offset]
            # A name already known for other bytes belongs to a concurrent request.
            stores = [(ts, n) for ts, n in stores if self._owner.get(n, content) == content]
            names = {n for ts, n in stores if since <= ts <= until}
            if len(names) != 1:
                names = {n for _, n in stores}
            if len(names) != 1:
                continue
            name = names.pop()
            known = self.aliases.setdefault(content, [])
            if name not in known:
                known.append(name)
                self._owner[name] = content
                learned[index] = name
                self.learned += 1
        return learned

    def confirm(self, content_ids: Sequence[str], naming: Sequence[str], shapes: BlockShapes,
                matched_blocks: int) -> None:
        """A naming under which a worker held ``matched_blocks`` of the request names every
        image whose first block is among them as the engine does."""
        firsts = shapes.first_blocks()
        for index, (content, name) in enumerate(zip(content_ids, naming, strict=True)):
            b = firsts.get(index)
            if b is not None and b < matched_blocks:
                known = self.aliases.setdefault(content, [])
                if name not in known:
                    known.append(name)
                    self._owner.setdefault(name, content)
                    self.learned += 1

    def namings(self, content_ids: Sequence[str]) -> list[tuple[str, ...]]:
        """Names to key a request's images by: mmlens' own content identities (engines that
        use them, and the request history) unless every image is known under another name,
        then each learned engine naming."""
        out = []
        if not all(c in self.aliases and c not in self.aliases[c] for c in content_ids):
            out.append(tuple(content_ids))
        for v in range(MAX_VARIANTS):
            naming = tuple(self._alias(c, v) for c in content_ids)
            if naming not in out:
                out.append(naming)
        return out[:MAX_VARIANTS]

    def _alias(self, content: str, v: int) -> str:
        known = self.aliases.get(content)
        if not known:
            return content
        return known[min(v, len(known) - 1)]

    def resolved(self, content_ids: Sequence[str]) -> bool:
        return all(c in self.aliases for c in content_ids)
