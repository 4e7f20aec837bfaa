"""The simulated worker's `/metrics`, with vLLM's names, units and labels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

disable_created_metrics()

_M = TypeVar("_M", Counter, Gauge, Histogram)

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


def _one_two_five(limit: int) -> list[float]:
    out: list[float] = []
    base = 1
    while True:
        for m in (1, 2, 5):
            if base * m > limit:
                return out
            out.append(float(base * m))
        base *= 10


class WorkerMetrics:
    def __init__(self, model_name: str, block_size: int, num_gpu_blocks: int,
                 max_model_len: int) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        r = self.registry
        self._lv = {"model_name": model_name, "engine": "0"}

        def zeroed(metric: _M) -> _M:
            metric.labels(**self._lv)  # the worker's series exists (at zero) from the start
            return metric

        def counter(name: str, doc: str) -> Counter:
            return zeroed(Counter(name, doc, labels, registry=r))

        def gauge(name: str, doc: str) -> Gauge:
            return zeroed(Gauge(name, doc, labels, registry=r))

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return zeroed(Histogram(name, doc, labels, buckets=buckets, registry=r))

        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits",
                                   "Prefix cache hits, in terms of number of cached tokens.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_tokens_cached = counter("vllm:prompt_tokens_cached",
                                            "Number of cached prompt tokens (local + external).")
        self.generation_tokens = counter("vllm:generation_tokens",
                                         "Number of generation tokens processed.")
        self.mm_queries = counter("vllm:mm_cache_queries",
                                  "Multi-modal cache queries, in terms of number of queried items.")
        self.mm_hits = counter("vllm:mm_cache_hits",
                               "Multi-modal cache hits, in terms of number of cached items.")
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               [*labels, "finished_reason"], registry=r)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc",
                              "KV-cache usage. 1 means 100 percent usage.")
        self.running = gauge("vllm:num_requests_running",
                             "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting",
                             "Number of requests waiting to be processed.")
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS)
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.",
            _one_two_five(max_model_len))
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     ["block_size", "num_gpu_blocks", "num_cpu_blocks", "cache_dtype",
                      "enable_prefix_caching", "prefix_caching_hash_algo",
                      "gpu_memory_utilization", "engine"], registry=r)
        info.labels(block_size=str(block_size), num_gpu_blocks=str(num_gpu_blocks),
                    num_cpu_blocks="0", cache_dtype="auto", enable_prefix_caching="True",
                    prefix_caching_hash_algo="sha256", gpu_memory_utilization="0.9",
                    engine="0").set(1)

    def lv(self, metric):  # type: ignore[no-untyped-def]
        return metric.labels(**self._lv)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class SglangMetrics(WorkerMetrics):
    """SGLang's names (``--enable-metrics``): the engine's counters land on ``sglang:*``
    series with SGLang's labels; what SGLang does not export goes to a registry nobody
    serves."""

    def __init__(self, model_name: str, block_size: int, num_gpu_blocks: int,
                 max_model_len: int) -> None:
        super().__init__(model_name, block_size, num_gpu_blocks, max_model_len)
        self.hidden = self.registry  # the vLLM-named series: kept, never served
        self._vllm_lv = self._lv
        self.registry = r = CollectorRegistry()
        labels = ["model_name", "engine_type", "tp_rank", "pp_rank"]
        lv = {"model_name": model_name, "engine_type": "unified", "tp_rank": "0",
              "pp_rank": "0"}

        def bind(metric: _M) -> _M:
            metric.labels(**lv)
            return metric

        self.prefix_queries = bind(Counter("sglang:prompt_tokens", "Number of prefill tokens "
                                           "processed.", labels, registry=r))
        self.prefix_hits = bind(Counter("sglang:cached_tokens", "Number of cached prompt "
                                        "tokens.", labels, registry=r))
        self.generation_tokens = bind(Counter("sglang:generation_tokens", "Number of "
                                              "generation tokens processed.", labels,
                                              registry=r))
        self.running = bind(Gauge("sglang:num_running_reqs", "The number of running requests.",
                                  labels, registry=r))
        self.waiting = bind(Gauge("sglang:num_queue_reqs", "The number of requests in the "
                                  "waiting queue.", labels, registry=r))
        self.kv_usage = bind(Gauge("sglang:token_usage", "The token usage.", labels,
                                   registry=r))
        self.ttft = bind(Histogram("sglang:time_to_first_token_seconds", "Histogram of time "
                                   "to first token in seconds.", labels,
                                   buckets=TTFT_BUCKETS, registry=r))
        self.e2e = bind(Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-"
                                  "end request latency in seconds", labels,
                                  buckets=LATENCY_BUCKETS, registry=r))
        bind(Gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV "
                   "cache pool.", labels, registry=r)).labels(**lv).set(
            block_size * num_gpu_blocks)
        self._lv = lv

    def lv(self, metric):  # type: ignore[no-untyped-def]
        names = getattr(metric, "_labelnames", ())
        return metric.labels(**(self._lv if "engine_type" in names else self._vllm_lv))
