"""Dynamo frontend JSON logs (`DYN_LOGGING_JSONL=true`, `mm_routing=debug`) beyond per-request
routing decisions: whether a model got exact MM-aware routing and why not, and the per-image
counts Dynamo computed.

Model-level lines come once per model registration and carry no request id, so
`mmlens.ingest.router_logs` (which keys everything by request) does not keep them. Dynamo 1.6.1 logs
the model directory path here (`/models/Qwen3-VL-2B-Instruct`), while request lines carry the
served name (`Qwen/Qwen3-VL-2B-Instruct`); `support_for` matches either.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from mmlens.ingest.numbers import as_int
from mmlens.ingest.router_logs import parsed_objects

ANY_MODEL = "*"
_NOT_SUPPORTED = " is not supported for MM-aware KV routing"
# Text each model-level line holds (ASCII, so verbatim in its JSON too): the lines without
# any are not parsed (an SMG log holds none, and a Dynamo log holds them once per model).
_MODEL_LINE_MARKS = ("MM-aware KV routing", "image-placeholder token id",
                     "routing image prompt could not be resolved")


@dataclass(slots=True)
class ModelMmRouting:
    """What the frontend said about one model's MM-aware (exact, pad-value) routing."""

    model: str
    exact: bool | None = None  # True: enabled; False: disabled (see reasons); None: unknown
    spec: str | None = None  # Dynamo's processor spec, e.g. "qwen3_vl", "kimi_k3"
    image_token_id: int | None = None
    reasons: list[str] = field(default_factory=list)

    def disabled(self, reason: str) -> None:
        self.exact = False
        if reason not in self.reasons:
            self.reasons.append(reason)


@dataclass(frozen=True, slots=True)
class ImageTokenCount:
    """One `image-token count` line: Dynamo's N for one image of one request."""

    request_id: str | None
    x_request_id: str | None
    model: str | None
    width: int | None
    height: int | None
    tokens: int | None
    mm_hash: int | None
    source: str | None


_int = as_int


def _reason_of(message: str) -> str:
    """The parenthesised reason of a 'not supported' line, without the trailing advice."""
    inner = message.split(_NOT_SUPPORTED, 1)[1].strip()
    if inner.startswith("("):
        depth = 0
        for i, ch in enumerate(inner):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return inner[1:i]
    return inner.split(". Falling back", 1)[0]


def model_mm_routing(lines: Iterable[str]) -> dict[str, ModelMmRouting]:
    """Per model (as logged), the last word of the frontend on exact MM routing.

    A frontend-wide switch (the fastokens tokenizer backend disables MM routing for every
    model) is reported under `ANY_MODEL`."""
    out: dict[str, ModelMmRouting] = {}

    def entry(model: str) -> ModelMmRouting:
        return out.setdefault(model, ModelMmRouting(model))

    marks = _MODEL_LINE_MARKS
    model_lines = [line for line in lines
                   if marks[0] in line or marks[1] in line or marks[2] in line]
    for obj in parsed_objects(model_lines):
        if obj.get("request_id") or obj.get("x_request_id"):
            continue
        msg = str(obj.get("message", ""))
        if msg.startswith("resolved image-placeholder token id"):
            e = entry(str(obj.get("model_id") or obj.get("model") or ANY_MODEL))
            e.spec = obj.get("spec") or e.spec
            e.image_token_id = _int(obj.get("image_token_id")) or e.image_token_id
        elif msg.startswith("MM-aware KV routing enabled"):
            e = entry(str(obj.get("model") or ANY_MODEL))
            e.exact, e.reasons = True, []
        elif _NOT_SUPPORTED in msg:
            model = str(obj.get("model") or msg.split(_NOT_SUPPORTED, 1)[0].strip())
            entry(model).disabled(_reason_of(msg))
        elif msg.startswith("model-specific routing image prompt could not be resolved"):
            entry(str(obj.get("model") or ANY_MODEL)).disabled(
                f"{msg}: {obj['error']}" if obj.get("error") else msg)
        elif "tokenizer backend is active; MM-aware KV routing disabled" in msg:
            entry(ANY_MODEL).disabled(msg.split(". ", 1)[0])
    return out


def support_for(table: dict[str, ModelMmRouting], model: str) -> ModelMmRouting | None:
    """The entry for a served name or model path: exact key, else the same last path part;
    a frontend-wide `ANY_MODEL` verdict applies when nothing more specific is known."""
    if model in table:
        return table[model]
    tail = model.rstrip("/").rsplit("/", 1)[-1].lower()
    for key, value in table.items():
        if key != ANY_MODEL and key.rstrip("/").rsplit("/", 1)[-1].lower() == tail:
            return value
    return table.get(ANY_MODEL)


_IMAGE_COUNT = re.compile(r"image-token count")


def image_token_counts(lines: Iterable[str]) -> list[ImageTokenCount]:
    out: list[ImageTokenCount] = []
    for obj in parsed_objects(lines):
        if not _IMAGE_COUNT.search(str(obj.get("message", ""))):
            continue
        out.append(ImageTokenCount(
            request_id=obj.get("request_id"), x_request_id=obj.get("x_request_id"),
            model=obj.get("model"), width=_int(obj.get("width")), height=_int(obj.get("height")),
            tokens=_int(obj.get("tokens")), mm_hash=_int(obj.get("mm_hash")),
            source=obj.get("source")))
    return out


def merge_mm_routing(into: dict[str, ModelMmRouting],
                     new: dict[str, ModelMmRouting]) -> bool:
    """Fold newly read verdicts into `into` (a later verdict wins); True when it changed."""
    changed = False
    for model, entry in new.items():
        old = into.get(model)
        if old is None:
            into[model] = entry
            changed = True
            continue
        before = (old.exact, old.spec, old.image_token_id, list(old.reasons))
        if entry.exact is not None:
            old.exact = entry.exact
            old.reasons = list(entry.reasons) if entry.exact is False or entry.reasons else []
        old.spec = entry.spec or old.spec
        old.image_token_id = entry.image_token_id or old.image_token_id
        changed |= before != (old.exact, old.spec, old.image_token_id, list(old.reasons))
    return changed
