"""Asking Dynamo for the worker id on a client's behalf, and giving the client back the answer
it would have had without asking.

Dynamo 1.6.1 names the worker that served a request (``nvext.worker_id``) and its timing
(``nvext.timing``) only when the request lists them in ``nvext.extra_fields``; no header
carries them. ``ask_for_fields`` adds what the client did not ask for; ``NvextRewrite`` then
cuts exactly those members out of the response JSON (each SSE ``data:`` line, or the whole
body), byte for byte otherwise: the rest of the text is not re-encoded, and an ``nvext``
left empty is removed as Dynamo omits it when nothing was asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

ASKED = ("worker_id", "timing")
MAX_BODY = 8 << 20  # a larger JSON answer passes as it came


@dataclass(slots=True)
class Asked:
    body: bytes
    rewrite: NvextRewrite


def ask_for_fields(body: bytes, fields: tuple[str, ...] = ASKED) -> Asked | None:
    """The request body with ``fields`` added to ``nvext.extra_fields``, and the rewrite that
    removes them from the answer; None when nothing is to be added or the body is not a JSON
    object the tap can re-encode faithfully (it then passes as it came)."""
    try:
        obj = msgspec.json.decode(body)
        if not isinstance(obj, dict):
            return None
        nvext = obj.get("nvext", {})
        extra = nvext.get("extra_fields", []) if isinstance(nvext, dict) else None
        if not isinstance(extra, list):
            return None
        missing = [f for f in fields if f not in extra]
        if not missing:
            return None
        obj["nvext"] = {**nvext, "extra_fields": [*extra, *missing]}
        return Asked(msgspec.json.encode(obj), NvextRewrite(frozenset(missing)))
    except (msgspec.DecodeError, msgspec.EncodeError, ValueError, RecursionError,
            UnicodeError, OverflowError):
        return None


@dataclass
class NvextRewrite:
    """Removes ``drop`` from ``nvext`` in each answer the router sends."""

    drop: frozenset[str]
    sse: bool = False
    _buf: bytearray = field(default_factory=bytearray)
    _passing: bool = False  # a JSON body over MAX_BODY: passed on as it came

    def feed(self, chunk: bytes) -> bytes:
        if self._passing:
            return chunk
        self._buf += chunk
        if not self.sse:
            if len(self._buf) > MAX_BODY:
                self._passing = True
                out, self._buf = bytes(self._buf), bytearray()
                return out
            return b""
        end = self._buf.rfind(b"\n")
        if end < 0:
            return b""
        lines = bytes(self._buf[:end + 1])
        del self._buf[:end + 1]
        return b"".join(self._line(line) for line in lines.splitlines(keepends=True))

    def finish(self) -> bytes:
        rest, self._buf = bytes(self._buf), bytearray()
        if self._passing or not rest:
            return rest
        return self._line(rest) if self.sse else strip_members(rest, self.drop)

    def _line(self, line: bytes) -> bytes:
        if not line.startswith(b"data:"):
            return line
        body = line[5:]
        lead = len(body) - len(body.lstrip())
        return line[:5 + lead] + strip_members(body[lead:], self.drop)


def strip_members(doc: bytes, drop: frozenset[str]) -> bytes:
    """``doc`` without ``nvext.<name>`` for each name in ``drop`` (and without ``nvext`` when
    nothing else is left in it); any text it cannot read is returned unchanged."""
    try:
        top = _object_members(doc, _skip_ws(doc, 0))
        nv = next((m for m in top if m[0] == b"nvext"), None)
        if nv is None or doc[nv[2]:nv[2] + 1] != b"{":
            return doc
        inner = _object_members(doc, nv[2])
        if not any(_key(m[0]) in drop for m in inner):
            return doc
        if all(_key(m[0]) in drop for m in inner):
            return _cut(doc, top, top.index(nv))
        for name in drop:  # the object's start stays put: each cut is inside it
            inner = _object_members(doc, nv[2])
            at = next((k for k, m in enumerate(inner) if _key(m[0]) == name), None)
            if at is not None:
                doc = _cut(doc, inner, at)
        return doc
    except (IndexError, ValueError):
        return doc


def _key(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


# A member: (key text, start of its key's quote, start of its value, end of its value).
Member = tuple[bytes, int, int, int]


def _cut(doc: bytes, members: list[Member], i: int) -> bytes:
    """``doc`` without member ``i`` of an object and one comma beside it."""
    _, start, _, end = members[i]
    if i + 1 < len(members):
        return doc[:start] + doc[members[i + 1][1]:]
    if i > 0:
        return doc[:members[i - 1][3]] + doc[end:]
    return doc[:start] + doc[_skip_ws(doc, end):]


def _object_members(doc: bytes, i: int) -> list[Member]:
    if doc[i:i + 1] != b"{":
        raise ValueError("not an object")
    out: list[Member] = []
    i = _skip_ws(doc, i + 1)
    if doc[i:i + 1] == b"}":
        return out
    while True:
        if doc[i:i + 1] != b'"':
            raise ValueError("expected a key")
        key_end = _string_end(doc, i)
        j = _skip_ws(doc, key_end)
        if doc[j:j + 1] != b":":
            raise ValueError("expected ':'")
        v = _skip_ws(doc, j + 1)
        end = _value_end(doc, v)
        out.append((doc[i + 1:key_end - 1], i, v, end))
        i = _skip_ws(doc, end)
        if doc[i:i + 1] == b"}":
            return out
        if doc[i:i + 1] != b",":
            raise ValueError("expected ','")
        i = _skip_ws(doc, i + 1)


def _skip_ws(doc: bytes, i: int) -> int:
    while i < len(doc) and doc[i] in b" \t\r\n":
        i += 1
    return i


def _string_end(doc: bytes, i: int) -> int:
    """The index after the string starting at ``i``."""
    j = i + 1
    while True:
        q = doc.index(b'"', j)
        backslashes = 0
        k = q - 1
        while doc[k] == 0x5C:  # an escaped quote has an odd run of backslashes before it
            backslashes += 1
            k -= 1
        if backslashes % 2 == 0:
            return q + 1
        j = q + 1


def _value_end(doc: bytes, i: int) -> int:
    c = doc[i:i + 1]
    if c == b'"':
        return _string_end(doc, i)
    if c in (b"{", b"["):
        depth, j = 0, i
        while j < len(doc):
            b = doc[j]
            if b == 0x22:
                j = _string_end(doc, j)
                continue
            if b in b"{[":
                depth += 1
            elif b in b"}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        raise ValueError("unterminated value")
    j = i
    while j < len(doc) and doc[j] not in b",}] \t\r\n":
        j += 1
    if j == i:
        raise ValueError("expected a value")
    return j
