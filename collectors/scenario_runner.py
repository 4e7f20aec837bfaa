"""Runs the core's scenarios against a live router through the trace client."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import ExitStack

import httpx
from mmlens.collectors.media_server import MediaServer
from mmlens.collectors.trace_sink import TraceSink
from mmlens.collectors.traces import ImagePart, TraceClient, solid_png

from mmlens.analysis import scenarios as sc
from mmlens.records import RequestTrace

Progress = Callable[[str, int, int], None]


class ScenarioRunner:
    def __init__(self, client: httpx.Client, router_url: str, model: str, *,
                 router_kind: str = "auto", sink: TraceSink | None = None,
                 worker_mode_router_url: str | None = None, api_key: str | None = None,
                 max_tokens: int = 4, progress: Progress | None = None) -> None:
        """``sink`` records every request's trace (with its expected layout; in the store
        when it writes), before the scenario is judged."""
        self.tracer = TraceClient(client, sink=sink)
        self.router_url = router_url
        self.model = model
        self.router_kind = router_kind
        self.worker_mode_router_url = worker_mode_router_url
        self.api_key = api_key
        self.max_tokens = max_tokens
        self.progress = progress

    def parts(self, spec: sc.RequestSpec, media: MediaServer | None) -> list[ImagePart]:
        out = []
        for img in spec.images:
            data = solid_png(img.width, img.height, img.color)
            if img.via == "url":
                if media is None:
                    raise RuntimeError("a URL image needs the media server")
                out.append(ImagePart(data=data, url=media.add(img.name, data)))
            else:
                out.append(ImagePart(data=data))
        return out

    def runnable(self, scenario: sc.Scenario) -> sc.Scenario:
        if self.worker_mode_router_url is None:
            kept = tuple(r for r in scenario.requests if r.mode != "worker")
            return dataclasses.replace(scenario, requests=kept)
        return scenario

    def run(self, scenario: sc.Scenario, ctx: sc.Context) -> sc.Result:
        scenario = self.runnable(scenario)
        traces: list[RequestTrace] = []
        with ExitStack() as stack:
            media = stack.enter_context(MediaServer()) if scenario.needs_media_server else None
            total = len(scenario.requests)
            for i, spec in enumerate(scenario.requests):
                if self.progress:
                    self.progress(f"{scenario.name}: {spec.label}", i, total)
                url = (self.worker_mode_router_url if spec.mode == "worker"
                       and self.worker_mode_router_url else self.router_url)
                images = self.parts(spec, media)
                # ImagePart with both bytes and URL: send the URL, keep the bytes for layout.
                trace = self.tracer.send(url, self.model, spec.text, images,
                                         router_kind=self.router_kind,
                                         max_tokens=self.max_tokens, api_key=self.api_key,
                                         processing_mode="worker" if spec.mode == "worker"
                                         else None)
                traces.append(trace)
        if self.progress:
            self.progress(f"{scenario.name}: done", len(scenario.requests),
                          len(scenario.requests))
        return sc.judge(scenario, ctx, traces)
