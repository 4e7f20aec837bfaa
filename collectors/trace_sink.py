"""The one path from a traced request to the store: every trace mmlens records — the Lab, the
warm-up, ``mmlens check``, ``mmlens collect --workload``, and the requests it only observed
(router logs, OTLP spans, the tap) — is recorded here.

``record`` describes what the request sent when mmlens knows it (each image probed once, its
identities, the expected layout when a layout model is set), then writes. The prompt text is
kept only when the sender opted in (``keep_text``): the stored layout record (counts, spans,
per-block content keys, image sizes and identities) serves the inspector and the explainer
without it. Routing decisions are not joined here: the store's reader joins them when read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mmlens.layout.expected import ExpectedLayout
from mmlens.layout.modeldir import Model, resolve_model
from mmlens.layout.sent import ImagePart, SentImage, describe_parts, expected_layout
from mmlens.records import RequestTrace
from mmlens.store.open import open_store

Writer = Callable[[list[RequestTrace]], object]


@dataclass(frozen=True, slots=True)
class SentRequest:
    """What mmlens sent (or the tap saw sent): the prompt text and the images, in order."""

    text: str
    images: Sequence[ImagePart] = ()


def store_writer(db_path: str | Path) -> Writer:
    """Writes each batch through its own connection: a sender that writes now and then does
    not hold the store open between requests."""

    def write(traces: list[RequestTrace]) -> int:
        store = open_store(db_path)
        try:
            return store.add_traces(traces)
        finally:
            store.close()

    return write


class TraceSink:
    def __init__(self, write: Writer | None = None, *, layout_model: str | None = None,
                 block_size: int = 16, keep_text: bool = False) -> None:
        """``write`` None: traces are described but not stored (a check without ``--db``);
        ``layout_model`` (a family or model directory) adds the expected layout."""
        self.write = write
        self.layout_model = layout_model
        self.block_size = block_size
        self.keep_text = keep_text
        self.recorded = 0
        self._model: Model | None = None

    def record(self, trace: RequestTrace, sent: SentRequest | None = None) -> RequestTrace:
        if sent is not None:
            self.describe(trace, sent)
        if self.write is not None:
            self.write([trace])
        self.recorded += 1
        return trace

    def record_all(self, traces: Sequence[RequestTrace]) -> None:
        """Traces that carry what is known of them already (observed requests)."""
        if traces and self.write is not None:
            self.write(list(traces))
        self.recorded += len(traces)

    def describe(self, trace: RequestTrace, sent: SentRequest) -> None:
        images = describe_parts(sent.images)
        trace.images = [im.info for im in images]
        if self.layout_model:
            trace.expected_layout = self.layout(sent.text, images)

    def layout(self, text: str, images: Sequence[SentImage]) -> ExpectedLayout | None:
        assert self.layout_model is not None
        try:
            if self._model is None:
                self._model = resolve_model(self.layout_model)
            lay = expected_layout(self._model, text, images, self.block_size)
        except Exception as exc:  # a layout the core refuses is information, not a crash
            return ExpectedLayout.failed(f"{type(exc).__name__}: {exc}")
        if lay is not None and lay.ok and self.keep_text:
            lay.text, lay.layout_model = text, self.layout_model
        return lay
