"""Which workers' engines announce every block they compute (vLLM), from the collectors'
targets and the routers' worker lists."""

from __future__ import annotations

from mmlens.analysis.judgement.engines import announces_all, announcing_units


def test_vllm_workers_by_config_then_by_the_routers_runtime():
    targets = {"workers": [
        {"name": "w1", "engine": "vllm", "router_url": "grpc://127.0.0.1:1"},
        {"name": "w2", "engine": "sglang", "router_url": "grpc://127.0.0.1:2"}]}
    state = [{"workers": [{"url": "grpc://127.0.0.1:2", "runtime": "vllm"},
                          {"url": "grpc://127.0.0.1:3", "runtime": "vllm"},
                          {"url": "grpc://127.0.0.1:4", "runtime": "sglang"}]}]
    units = announcing_units(targets, state)
    # the configured engine wins over the router's word for it
    assert units == {"w1", "grpc://127.0.0.1:1", "grpc://127.0.0.1:3"}
    assert announces_all(units, "grpc://127.0.0.1:1#2")
    assert not announces_all(units, "grpc://127.0.0.1:2")
    assert announcing_units(None, None) == frozenset()
