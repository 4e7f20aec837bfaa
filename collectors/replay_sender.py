"""Sends a replay plan (``mmlens.replay.plan``) to a live OpenAI-compatible router: each
request at its planned time, at most ``concurrency`` in flight (a request that finds every
slot busy waits, and its lateness is counted), through ``TraceClient`` so each replayed
request is traced like any other mmlens sends (and stored when the sink writes)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
from mmlens.collectors.trace_sink import TraceSink
from mmlens.collectors.traces import TraceClient

from mmlens.layout.sent import ImagePart
from mmlens.replay.images import cached_identity_png
from mmlens.replay.plan import Plan, PlannedRequest
from mmlens.replay.summary import Outcome, ReplaySummary, summarize


class Replayer:
    def __init__(self, client: httpx.Client, *, sink: TraceSink | None = None,
                 concurrency: int = 8, timeout_s: float = 120.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.tracer = TraceClient(client, timeout_s=timeout_s, sink=sink)
        self.concurrency = concurrency
        self.clock = clock
        self.sleep = sleep

    def run(self, plan: Plan, to: str, *, router_kind: str = "auto", stream: bool = False,
            ) -> ReplaySummary:
        outcomes, elapsed = self.send_all(plan, to, router_kind=router_kind, stream=stream)
        return summarize(plan, outcomes, elapsed)

    def send_all(self, plan: Plan, to: str, *, router_kind: str = "auto",
                 stream: bool = False) -> tuple[list[Outcome], float]:
        """Each replayed request's outcome (by send time) and the seconds it all took;
        a request streams when it was recorded streaming, or every one with ``stream``."""
        outcomes: list[Outcome] = []
        lock = threading.Lock()
        slots = threading.Semaphore(self.concurrency)
        start = self.clock()

        def one(p: PlannedRequest, sent_at: float) -> None:
            try:
                outcome = self._send(p, to, router_kind, stream, sent_at)
            finally:
                slots.release()
            with lock:
                outcomes.append(outcome)

        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="mmlens-replay") as pool:
            for p in plan.requests:
                wait = start + p.offset_s - self.clock()
                if wait > 0:
                    self.sleep(wait)
                slots.acquire()
                pool.submit(one, p, self.clock() - start)
        outcomes.sort(key=lambda o: o.sent_at_s)
        return outcomes, self.clock() - start

    def _send(self, p: PlannedRequest, to: str, router_kind: str, stream: bool,
              sent_at: float) -> Outcome:
        rid = f"replay-{uuid.uuid4().hex[:16]}"
        try:
            images = [ImagePart(cached_identity_png(im.identity, im.width, im.height))
                      for im in p.images]
            t = self.tracer.send(to, p.model, p.text, images, router_kind=router_kind,
                                 stream=stream or p.stream, max_tokens=p.max_tokens, request_id=rid)
        except Exception as exc:  # a store that refused the trace: the request still counts
            return Outcome(p, rid, sent_at, sent_at - p.offset_s, None,
                           f"replay_error: {type(exc).__name__}", None, None, None, None)
        code = t.error_code or ("error" if t.error else None)
        return Outcome(p, rid, sent_at, sent_at - p.offset_s, t.status, code, t.prompt_tokens,
                       t.cached_tokens, t.worker, t.latency_s)
