"""Router admin polling with recorded SMG answers, a Dynamo-shaped router, bad answers."""

from __future__ import annotations

import json

import httpx
from mmlens.collectors.router_state import RouterStateCollector

from mmlens.config import RouterTarget
from tests.fixtures_path import capture

SMG = {
    "/workers": capture("smg_grpc_workers.json"),
    "/get_loads": capture("smg_grpc_get_loads.json"),
    "/v1/models": capture("smg_http_v1_models.txt"),
    "/readiness": capture("smg_http_readiness.txt"),
}


def _client(routes: dict[str, tuple[int, str, str]], seen: list[httpx.Request]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status, ctype, body = routes.get(request.url.path, (404, "application/json", "{}"))
        return httpx.Response(status, headers={"content-type": ctype}, text=body)

    return httpx.Client(transport=httpx.MockTransport(handler))


def test_smg_state_with_api_key_from_env(monkeypatch) -> None:
    monkeypatch.setenv("MMLENS_TEST_ADMIN_KEY", "sk-admin")
    seen: list[httpx.Request] = []
    client = _client({p: (200, "application/json", b) for p, b in SMG.items()}, seen)
    col = RouterStateCollector(client)
    router = RouterTarget("smg", "auto", "http://smg:30000", api_key_env="MMLENS_TEST_ADMIN_KEY")
    state = col.poll(router)
    assert state["kind"] == "smg"
    assert [w["url"] for w in state["workers"]] == ["grpc://127.0.0.1:50051",
                                                   "grpc://127.0.0.1:50052"]
    assert [x["worker"] for x in state["loads"]] == ["grpc://127.0.0.1:50051",
                                                     "grpc://127.0.0.1:50052"]
    assert state["models"] == ["Qwen/Qwen3-VL-2B-Instruct"]
    assert state["readiness"] == {"status": "ready", "healthy_workers": 2, "total_workers": 2}
    assert all(r.headers["authorization"] == "Bearer sk-admin" for r in seen)
    assert "sk-admin" not in json.dumps(state)
    assert col.health["smg"].errors == {} and col.health["smg"].last_success


def test_dynamo_state() -> None:
    routes = {"/v1/models": (200, "application/json",
                             '{"object":"list","data":[{"id":"Qwen/Qwen3-0.6B"}]}'),
              "/health": (200, "application/json", '{"status":"healthy","instances":[]}')}
    col = RouterStateCollector(_client(routes, []))
    state = col.poll(RouterTarget("dyn", "auto", "http://dyn:8000"))
    assert (state["kind"], state["models"], state["health"]["status"]) == (
        "dynamo", ["Qwen/Qwen3-0.6B"], "healthy")


def test_html_and_broken_answers_are_counted() -> None:
    routes = {"/workers": (200, "text/html", "<html>login</html>"),
              "/get_loads": (200, "application/json", '{"weird": 1}'),
              "/v1/models": (200, "application/json", "not json"),
              "/readiness": (503, "application/json", '{"status":"not ready"}')}
    col = RouterStateCollector(_client(routes, []))
    state = col.poll(RouterTarget("smg", "smg", "http://smg"))
    assert "workers" not in state
    assert col.health["smg"].errors == {"html_answer": 1, "bad_shape": 1, "bad_json": 1}
    assert col.health["smg"].last_success is None


def test_an_answer_nested_past_the_decoder_is_bad_json_not_a_crash() -> None:
    deep = '{"workers": ' + "[" * 100_000 + "]" * 100_000 + "}"  # RecursionError in json
    routes = {p: (200, "application/json", b) for p, b in SMG.items()}
    routes["/workers"] = (200, "application/json", deep)
    col = RouterStateCollector(_client(routes, []))
    state = col.poll(RouterTarget("smg", "smg", "http://smg"))
    assert "workers" not in state and state["models"] == ["Qwen/Qwen3-VL-2B-Instruct"]
    assert col.health["smg"].errors == {"bad_json": 1}


def test_dynamo_indexer_dump_and_query() -> None:
    dump = {"Qwen/Qwen3-VL-2B-Instruct:default": [
        {"worker_id": 7, "event": {"event_id": 1, "data": {"stored": {
            "parent_hash": None, "blocks": [{"block_hash": 1, "tokens_hash": 2},
                                            {"block_hash": 3, "tokens_hash": 4}]}}}},
        {"worker_id": 7, "event": {"event_id": 2, "data": {"removed": {"block_hashes": [1]}}}},
        {"worker_id": 9, "event": {"event_id": 1, "data": {"stored": {"blocks": [{}]}}}}]}
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/query":
            return httpx.Response(200, json={"scores": {"7": {"0": 32}, "9": {"0": 0, "1": 16}},
                                             "frequencies": [2, 1], "tree_sizes": {}})
        if request.url.path == "/dump":
            return httpx.Response(200, json=dump)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "Qwen/Qwen3-VL-2B-Instruct"}]})
        return httpx.Response(200, json={"status": "healthy"})

    col = RouterStateCollector(httpx.Client(transport=httpx.MockTransport(handler)))
    state = col.poll(RouterTarget("dyn", "dynamo", "http://dyn:8000",
                                  indexer_url="http://idx:8090"))
    assert state["indexer"] == {"Qwen/Qwen3-VL-2B-Instruct:default": {
        "7:events": 2, "7:stored_blocks": 2, "9:events": 1, "9:stored_blocks": 1}}
    scores = col.indexer_query("http://idx:8090", [1] * 48, "Qwen/Qwen3-VL-2B-Instruct")
    assert scores == {"7": {0: 32}, "9": {0: 0, 1: 16}}
    assert json.loads(seen[-1].content) == {"token_ids": [1] * 48,
                                            "model_name": "Qwen/Qwen3-VL-2B-Instruct",
                                            "tenant_id": "default"}
