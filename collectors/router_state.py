"""Router admin state: SMG ``/workers``, ``/get_loads``, ``/v1/models``, ``/readiness``;
Dynamo ``/v1/models``, ``/health``. The API key (from the env var the config names) is sent
as a bearer token and never recorded."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import httpx

from mmlens.config import RouterTarget
from mmlens.ingest.router_state import (
    parse_get_loads,
    parse_indexer_scores,
    parse_models,
    parse_smg_workers,
    summarize_indexer_dump,
)
from mmlens.records import CollectorHealth, RouterWorker

SMG_PATHS = ("/workers", "/get_loads", "/v1/models", "/readiness")
DYNAMO_PATHS = ("/v1/models", "/health")


class RouterStateCollector:
    def __init__(self, client: httpx.Client, timeout_s: float = 2.0) -> None:
        self.client = client
        self.timeout = httpx.Timeout(timeout_s)
        self.health: dict[str, CollectorHealth] = {}

    def _get(self, router: RouterTarget, path: str, h: CollectorHealth) -> Any:
        headers = {}
        key = router.api_key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        try:
            resp = self.client.get(router.url.rstrip("/") + path, headers=headers,
                                   timeout=self.timeout)
        except httpx.TimeoutException:
            h.error("timeout", path, time.time())
            return None
        except httpx.HTTPError as exc:
            h.error("unreachable", f"{path}: {type(exc).__name__}", time.time())
            return None
        if "html" in resp.headers.get("content-type", ""):
            h.error("html_answer", path, time.time())
            return None
        try:
            body = resp.json()
        except (ValueError, RecursionError):  # nested deeper than json.loads recurses
            h.error("bad_json", f"{path}: HTTP {resp.status_code}", time.time())
            return None
        if resp.status_code >= 400 and path not in ("/health", "/readiness"):
            h.error("http_status", f"{path}: HTTP {resp.status_code}", time.time())
            return None
        return body

    def detect_kind(self, router: RouterTarget) -> str:
        """``auto`` → smg when ``/workers`` answers in SMG's shape, else dynamo."""
        if router.kind != "auto":
            return router.kind
        h = self.health.setdefault(router.name, CollectorHealth("router_state", router.name))
        body = self._get(router, "/workers", h)
        return "smg" if isinstance(body, dict) and "workers" in body else "dynamo"

    def poll(self, router: RouterTarget) -> dict[str, Any]:
        h = self.health.setdefault(router.name, CollectorHealth("router_state", router.name))
        kind = self.detect_kind(router)
        state: dict[str, Any] = {"router": router.name, "url": router.url, "kind": kind,
                                 "ts": time.time()}
        ok = True
        if kind == "smg":
            workers = self._get(router, "/workers", h)
            if workers is None:
                ok = False
            else:
                try:
                    state["workers"] = [asdict(w) for w in parse_smg_workers(workers)]
                except ValueError as exc:
                    h.error("bad_shape", f"/workers: {exc}", time.time())
                    ok = False
            loads = self._get(router, "/get_loads", h)
            if loads is not None:
                try:
                    state["loads"] = [asdict(x) for x in parse_get_loads(loads)]
                except ValueError as exc:
                    h.error("bad_shape", f"/get_loads: {exc}", time.time())
                    ok = False
            state["readiness"] = self._get(router, "/readiness", h)
        else:
            state["health"] = self._get(router, "/health", h)
            if router.indexer_url:
                state["indexer"] = self.indexer_dump(router, h)
        models = self._get(router, "/v1/models", h)
        try:
            state["models"] = parse_models(models) if models is not None else []
        except ValueError as exc:
            h.error("bad_shape", f"/v1/models: {exc}", time.time())
        if ok and (state.get("workers") is not None or state.get("health") is not None):
            h.ok(time.time())
        return state

    @staticmethod
    def workers_of(state: dict[str, Any]) -> list[RouterWorker]:
        return [RouterWorker(**w) for w in state.get("workers", [])]

    def indexer_dump(self, router: RouterTarget, h: CollectorHealth) -> dict[str, Any] | None:
        assert router.indexer_url
        target = RouterTarget(router.name, "dynamo", router.indexer_url,
                              api_key_env=router.api_key_env)
        doc = self._get(target, "/dump", h)
        if doc is None:
            return None
        try:
            return summarize_indexer_dump(doc)
        except ValueError as exc:
            h.error("bad_shape", f"indexer /dump: {exc}", time.time())
            return None

    def indexer_query(self, indexer_url: str, token_ids: list[int], model: str,
                      tenant_id: str = "default", lora_name: str | None = None,
                      ) -> dict[str, dict[int, int]]:
        """Matched tokens per worker and DP rank for a token sequence (for image requests,
        send the pad-value routing tokens: the indexer hashes raw ids without MM info)."""
        body: dict[str, Any] = {"token_ids": token_ids, "model_name": model,
                                "tenant_id": tenant_id}
        if lora_name:
            body["lora_name"] = lora_name
        resp = self.client.post(indexer_url.rstrip("/") + "/query", json=body,
                                timeout=self.timeout)
        resp.raise_for_status()
        try:
            doc = resp.json()
        except RecursionError:
            raise ValueError("indexer answer nested too deep") from None
        return parse_indexer_scores(doc)
