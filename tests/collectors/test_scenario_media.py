"""Where the scenario runner's URL images come from: the configured media origin (uploaded
first) or, without one, a loopback server of mmlens' own, whose refusal by the workers is
explained in the scenario's summary. The router is a MockTransport that fetches only from the
hosts it allows, as the demo's workers do."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import httpx
import pytest
from mmlens.collectors.media_upload import MediaOriginError
from mmlens.collectors.scenario_runner import ScenarioRunner

from mmlens.analysis import scenarios as sc
from mmlens.layout.modeldir import resolve_model

MODEL = "Qwen/Qwen3-VL-2B-Instruct"
ORIGIN = "http://127.0.0.1:18407"


class Router:
    """Answers chat requests whose image URLs lie on an allowed host:port, 400 otherwise;
    takes uploads at ORIGIN."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed
        self.uploads: dict[str, bytes] = {}
        self.urls: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            if f"{request.url.host}:{request.url.port}" not in self.allowed:
                return httpx.Response(413, json={"error": "image over the limit"})
            self.uploads[request.url.path] = request.content
            return httpx.Response(201, json={"url": str(request.url)})
        body = json.loads(request.content)
        for part in body["messages"][-1]["content"]:
            url = part.get("image_url", {}).get("url", "")
            if url.startswith("http"):
                self.urls.append(url)
                host = urlsplit(url).netloc
                if host not in self.allowed:
                    return httpx.Response(400, json={"error": {
                        "message": f"media host {host} is not in the allowed hosts"}})
        return httpx.Response(200, json={"id": "x", "choices": [], "usage": {
            "prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}})


def run_identity(router: Router, origin: str | None) -> sc.Result:
    model = resolve_model("qwen3-vl")
    ctx = sc.Context(block_size=16, model_family=model.family.name,
                     count_of=lambda w, h: model.family.image_token_count(
                         w, h, model.processor_config))
    plan = {s.name: s for s in sc.build(ctx, 7)}["identity"]
    client = httpx.Client(transport=httpx.MockTransport(router))
    runner = ScenarioRunner(client, "http://router", MODEL, router_kind="smg",
                            media_origin=origin)
    return runner.run(plan, ctx)


def test_url_images_are_uploaded_to_the_configured_origin() -> None:
    router = Router({"127.0.0.1:18407"})
    result = run_identity(router, ORIGIN)
    assert result.verdict == "pass", result.summary
    assert len(router.urls) == 2 and len(router.uploads) == 1  # one image, two names
    first, second = router.urls
    assert first.startswith(ORIGIN + "/media/") and first.endswith("/one.png")
    assert second.endswith("/two.png") and first.rsplit("/", 1)[0] == second.rsplit("/", 1)[0]
    assert urlsplit(first).path.rsplit("/", 1)[0] in router.uploads


def test_without_an_origin_a_refusal_says_what_to_configure() -> None:
    router = Router({"127.0.0.1:18407"})
    result = run_identity(router, None)
    assert result.verdict == "inconclusive"
    assert len(router.urls) == 2 and not router.uploads
    local = urlsplit(router.urls[0]).netloc
    assert local != "127.0.0.1:18407"
    assert f"the workers refused image URLs from mmlens' own media server http://{local}" \
        in result.summary
    assert "--media-origin" in result.summary and "127.0.0.1:*" in result.summary


def test_an_origin_that_refuses_the_upload_is_an_error() -> None:
    with pytest.raises(MediaOriginError, match="HTTP 413"):
        run_identity(Router(set()), ORIGIN)
