"""The Lab's request sender: traced chat requests through the collectors' TraceClient, each
trace recorded in the store with an expected layout that keeps the prompt text and model, so
the inspector can rebuild every view's token ids later."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from mmlens.collectors.traces import ImagePart, LayoutHook, TraceClient, model_layout_hook

from mmlens.records import RequestTrace
from mmlens.store.sqlite import Store


def layout_hook_with_text(layout_model: str, block_size: int = 16) -> LayoutHook:
    inner = model_layout_hook(layout_model, block_size)

    def hook(text: str, images: Sequence[ImagePart], model: str) -> dict[str, Any] | None:
        summary = inner(text, images, model)
        if summary is not None:
            summary = {**summary, "text": text, "layout_model": layout_model}
        return summary

    return hook


class LabSender:
    def __init__(self, db_path: str | Path, client: httpx.Client | None = None,
                 timeout_s: float = 60.0) -> None:
        self.db_path = str(db_path)
        self.client = client or httpx.Client()
        self.timeout_s = timeout_s

    def send(self, router_url: str, model: str, text: str, images: Sequence[ImagePart] = (),
             *, router_kind: str = "auto", layout_model: str | None = None,
             block_size: int = 16, stream: bool = False, max_tokens: int = 8,
             api_key: str | None = None) -> RequestTrace:
        hook = layout_hook_with_text(layout_model or model, block_size)
        tracer = TraceClient(self.client, timeout_s=self.timeout_s, layout_hook=hook)
        trace = tracer.send(router_url, model, text, images, router_kind=router_kind,
                            stream=stream, max_tokens=max_tokens, api_key=api_key)
        store = Store(self.db_path)
        try:
            store.add_traces([trace])
        finally:
            store.close()
        return trace

    def close(self) -> None:
        self.client.close()


def run_scenario(db_path: str | Path, router_url: str, model: str, layout_model: str,
                 name: str, *, router_kind: str = "auto", block_size: int = 16,
                 worker_mode_router_url: str | None = None, api_key: str | None = None,
                 progress: Any = None, salt: int | None = None) -> Any:
    """One scenario of ``mmlens.analysis.scenarios`` through ``ScenarioRunner``; its traces are
    recorded in the store (with text, so the inspector rebuilds them). Returns the Result."""
    from mmlens.collectors.scenario_runner import ScenarioRunner

    from mmlens.analysis import scenarios as sc
    from mmlens.layout.modeldir import resolve_model

    resolved = resolve_model(layout_model)
    ctx = sc.Context(block_size=block_size, model_family=resolved.family.name,
                     count_of=lambda w, h: resolved.family.image_token_count(
                         w, h, resolved.processor_config))
    plans = {s.name: s for s in sc.build(ctx, random.randrange(256) if salt is None else salt)}
    with httpx.Client(timeout=60.0) as client:
        runner = ScenarioRunner(client, router_url, model, router_kind=router_kind,
                                layout_hook=layout_hook_with_text(layout_model, block_size),
                                worker_mode_router_url=worker_mode_router_url,
                                api_key=api_key, progress=progress)
        try:
            result = runner.run(plans[name], ctx)
        finally:
            if runner.sent:
                store = Store(str(db_path))
                try:
                    store.add_traces(runner.sent)
                finally:
                    store.close()
    return result
