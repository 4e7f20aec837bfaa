"""The one interface through which the dashboard's pages (and the warm-up) send traced
requests: ``Sender`` owns the HTTP client and records every trace through the trace sink, with
an expected layout. Pages import nothing else from the collectors."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from mmlens.collectors.scenario_runner import ScenarioRunner
from mmlens.collectors.trace_sink import TraceSink, store_writer
from mmlens.collectors.traces import TraceClient

from mmlens.analysis import scenarios as sc
from mmlens.layout.modeldir import resolve_model
from mmlens.layout.sent import ImagePart
from mmlens.records import RequestTrace

Progress = Callable[[str, int, int], None]


class Sender:
    def __init__(self, db_path: str | Path, client: httpx.Client | None = None,
                 timeout_s: float = 60.0) -> None:
        self.db_path = str(db_path)
        self.write = store_writer(self.db_path)
        self.client = client or httpx.Client()
        self.timeout_s = timeout_s

    def sink(self, layout_model: str, block_size: int = 16, keep_text: bool = False,
             ) -> TraceSink:
        return TraceSink(self.write, layout_model=layout_model, block_size=block_size,
                         keep_text=keep_text)

    def send(self, router_url: str, model: str, text: str, images: Sequence[ImagePart] = (),
             *, router_kind: str = "auto", layout_model: str | None = None,
             block_size: int = 16, stream: bool = False, max_tokens: int = 8,
             api_key: str | None = None, keep_text: bool = False,
             processing_mode: str | None = None) -> RequestTrace:
        """One traced request, recorded in the store. ``keep_text``: store the prompt text
        too (the inspector then rebuilds every view's token ids); ``processing_mode``: the
        mode the router is known to run in (router | worker), when known."""
        tracer = TraceClient(self.client, timeout_s=self.timeout_s,
                             sink=self.sink(layout_model or model, block_size, keep_text))
        return tracer.send(router_url, model, text, images, router_kind=router_kind,
                           stream=stream, max_tokens=max_tokens, api_key=api_key,
                           processing_mode=processing_mode)

    def send_together(self, router_url: str, model: str,
                      requests: Sequence[tuple[str, Sequence[ImagePart]]], **kwargs: Any,
                      ) -> list[RequestTrace]:
        """The requests sent at the same moment, one thread each, as concurrent users send
        them: a router that breaks ties by load sees them in flight together. Traces in the
        order of ``requests``; ``kwargs`` as for ``send``."""
        if not requests:
            return []
        with ThreadPoolExecutor(len(requests), thread_name_prefix="mmlens-send") as pool:
            futures = [pool.submit(self.send, router_url, model, text, images, **kwargs)
                       for text, images in requests]
            return [f.result() for f in futures]

    def run_scenario(self, router_url: str, model: str, layout_model: str, name: str, *,
                     router_kind: str = "auto", block_size: int = 16,
                     worker_mode_router_url: str | None = None, api_key: str | None = None,
                     progress: Progress | None = None, salt: int | None = None,
                     media_origin: str | None = None) -> sc.Result:
        """One scenario of ``mmlens.analysis.scenarios``; its traces are recorded in the store
        with their text (the scenarios' own prompts, so the inspector rebuilds them). URL
        images go to ``media_origin`` when given (the router target's), else to a loopback
        server of mmlens' own."""
        resolved = resolve_model(layout_model)
        ctx = sc.Context(block_size=block_size, model_family=resolved.family.name,
                         count_of=lambda w, h: resolved.family.image_token_count(
                             w, h, resolved.processor_config))
        plans = {s.name: s for s in sc.build(ctx, random.randrange(256) if salt is None
                                             else salt)}
        runner = ScenarioRunner(self.client, router_url, model, router_kind=router_kind,
                                sink=self.sink(layout_model, block_size, keep_text=True),
                                worker_mode_router_url=worker_mode_router_url,
                                api_key=api_key, progress=progress,
                                media_origin=media_origin)
        return runner.run(plans[name], ctx)

    def close(self) -> None:
        self.client.close()
