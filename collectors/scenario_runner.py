"""Runs the core's scenarios against a live router through the trace client.

URL images come from the configured ``media_origin`` (uploaded there first) when there is
one, else from a loopback media server started for the scenario, which the cluster's workers
must then be allowed to fetch from."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack

import httpx
from mmlens.collectors.media_server import MediaServer
from mmlens.collectors.media_upload import upload
from mmlens.collectors.trace_sink import TraceSink
from mmlens.collectors.traces import ImagePart, TraceClient, solid_png

from mmlens.analysis import scenarios as sc
from mmlens.records import RequestTrace, Verdict

Progress = Callable[[str, int, int], None]
# The stored verdicts of requests just sent (the verdict job run over the check's store).
Verdicts = Callable[[Sequence[RequestTrace]], Mapping[str, Verdict]]


class ScenarioRunner:
    def __init__(self, client: httpx.Client, router_url: str, model: str, *,
                 router_kind: str = "auto", sink: TraceSink | None = None,
                 worker_mode_router_url: str | None = None, api_key: str | None = None,
                 max_tokens: int = 4, progress: Progress | None = None,
                 media_origin: str | None = None, verdicts: Verdicts | None = None) -> None:
        """``sink`` records every request's trace (with its expected layout; in the store
        when it writes), before the scenario is judged. ``media_origin``: where URL images
        are uploaded (MediaOriginError when it refuses). ``verdicts`` gives each sent
        request's stored verdict (the check's rows show them)."""
        self.tracer = TraceClient(client, sink=sink)
        self.router_url = router_url
        self.model = model
        self.router_kind = router_kind
        self.worker_mode_router_url = worker_mode_router_url
        self.api_key = api_key
        self.max_tokens = max_tokens
        self.progress = progress
        self.media_origin = media_origin
        self.client = client
        self.verdicts = verdicts

    def parts(self, spec: sc.RequestSpec, media: MediaServer | None) -> list[ImagePart]:
        out = []
        for img in spec.images:
            data = solid_png(img.width, img.height, img.color)
            if img.via == "url":
                if self.media_origin:
                    url = upload(self.client, self.media_origin, data, img.name)
                elif media is None:
                    raise RuntimeError("a URL image needs the media server")
                else:
                    url = media.add(img.name, data)
                out.append(ImagePart(data=data, url=url))
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
            media = (stack.enter_context(MediaServer())
                     if scenario.needs_media_server and not self.media_origin else None)
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
            origin = media.base_url if media else None
        if self.progress:
            self.progress(f"{scenario.name}: done", len(scenario.requests),
                          len(scenario.requests))
        result = sc.judge(scenario, ctx, traces,
                          None if self.verdicts is None else self.verdicts(traces))
        if origin and any((t.error or (t.status or 0) >= 400)
                          and any(i.via == "url" for i in spec.images)
                          for spec, t in zip(scenario.requests, traces, strict=True)):
            result.summary += local_origin_hint(origin, traces)
        return result


def local_origin_hint(origin: str, traces: list[RequestTrace]) -> str:
    """What to do when URL images from mmlens' own loopback media server failed."""
    host = origin.removeprefix("http://").rsplit(":", 1)[0]
    refused = any("allowed hosts" in (t.error or "") for t in traces)
    what = (f"the workers refused image URLs from mmlens' own media server {origin}" if refused
            else f"image URLs from mmlens' own media server {origin} failed (workers that "
            "fetch images themselves may not allow it)")
    return (f" — {what}, a port picked for this run: give mmlens a media origin the workers "
            "fetch from (mmlens check --media-origin, or media_origin of the router in "
            "mmlens.toml; the demo publishes its own in its ready file), or allow "
            f"{host}:* on the workers")
