"""The simulated worker's pieces without processes: prefix cache, wire encodings, expansion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mmlens.demo.expansion import Expander, PlaceholderMismatch
from mmlens.demo.kv_wire import encode_batch
from mmlens.demo.media import DecodedImage, MediaError, decode_image
from mmlens.demo.model_dirs import MODELS
from mmlens.demo.prefix_cache import (
    AllCleared,
    MediaSpan,
    PrefixCache,
    RemovedBlocks,
    SglangPrefixCache,
    StoredBlocks,
    block_extra_keys,
)

from tests.demo.support import decode_payload, png_data_url
from tests.live_support import wait_until_async

BS = 4


def prompt_with_image(identifier: str) -> tuple[list[int], list[MediaSpan]]:
    head = [1, 2, 3, 4]
    ids = head + [99] * 8 + [5, 6, 7, 8, 9]
    return ids, [MediaSpan(identifier, len(head), 8)]


def test_extra_keys_follow_vllm_offsets() -> None:
    # image at 4..67 (64 tokens), block 16: block 0 gets (id, 4), block 1 (id, -12) ...
    media = [MediaSpan("img", 4, 64)]
    assert block_extra_keys(0, 16, media) == [("img", 4)]
    assert block_extra_keys(16, 32, media) == [("img", -12)]
    assert block_extra_keys(64, 80, media) == [("img", -60)]
    assert block_extra_keys(80, 96, media) is None


def test_repeat_hits_all_full_blocks_but_the_last_token() -> None:
    cache = PrefixCache(block_size=BS, num_blocks=64)
    ids, media = prompt_with_image("a")
    events: list = []
    first = cache.allocate(ids, media, events)
    assert first.cached_tokens == 0
    cache.commit(first, events)
    cache.release(first)
    assert len(events) == 1 and isinstance(events[0], StoredBlocks)
    assert len(events[0].block_hashes) == len(ids) // BS  # only full blocks
    assert events[0].parent_block_hash is None
    events.clear()
    again = cache.allocate(ids, media, events)
    assert again.cached_tokens == 16  # 17 tokens: 4 full blocks, the tail is not cached
    cache.commit(again, events)
    assert events == []  # a hit announces nothing


def test_prompt_fully_cached_recomputes_last_block() -> None:
    cache = PrefixCache(block_size=BS, num_blocks=64)
    ids = list(range(16))
    events: list = []
    a = cache.allocate(ids, [], events)
    cache.commit(a, events)
    cache.release(a)
    events.clear()
    b = cache.allocate(ids, [], events)
    assert b.cached_tokens == 12  # vLLM never hits the last prompt token
    # ... and caches the block it computes again beside the first copy, announced again
    assert [(e.block_hashes, e.parent_block_hash) for e in events] == [
        ([a.hashes[3]], a.hashes[2])]
    assert list(cache.cached[a.hashes[3]]) == [a.block_ids[3], b.block_ids[3]]


def test_blocks_are_cached_when_allocated_so_a_request_in_flight_shares_them() -> None:
    # vLLM's scheduler caches a prompt's full blocks in allocate_slots, before its prefill
    # ran: the next request finds them, and only the one that computed them announces them.
    cache = PrefixCache(block_size=BS, num_blocks=64)
    ids = list(range(10))
    events: list = []
    a = cache.allocate(ids, [], events)
    assert [e.block_hashes for e in events] == [a.hashes]
    b = cache.allocate(ids, [], events)
    assert b.cached_tokens == 8 and len(events) == 1
    cache.commit(a, events)
    cache.commit(b, events)
    assert len(events) == 1


def test_each_copy_of_a_block_is_removed_on_its_own() -> None:
    cache = PrefixCache(block_size=BS, num_blocks=6)
    events: list = []
    a = cache.allocate(list(range(8)), [], events)
    cache.release(a)
    b = cache.allocate(list(range(8)), [], events)  # its last block again: a second copy
    cache.release(b)
    events.clear()
    cache.allocate(list(range(100, 124)), [], events)  # evicts all six
    removed = [h for e in events if isinstance(e, RemovedBlocks) for h in e.block_hashes]
    assert sorted(removed) == sorted([a.hashes[0], a.hashes[1], a.hashes[1]])
    assert a.hashes[1] not in cache.cached


def test_sglang_keeps_one_copy_of_a_prefix_computed_twice() -> None:
    # SGLang inserts a prompt into its radix tree after its prefill: two requests in flight
    # both compute it, the second insert finds it there and announces nothing.
    cache = SglangPrefixCache(block_size=BS, num_blocks=64)
    ids = list(range(10))
    events: list = []
    a = cache.allocate(ids, [], events)
    b = cache.allocate(ids, [], events)
    assert events == [] and b.cached_tokens == 0
    cache.commit(a, events)
    cache.commit(b, events)
    assert [e.block_hashes for e in events] == [a.hashes]


def test_different_images_same_ids_do_not_share_blocks() -> None:
    cache = PrefixCache(block_size=BS, num_blocks=64)
    events: list = []
    ids, media_a = prompt_with_image("a")
    _, media_b = prompt_with_image("b")
    a = cache.allocate(ids, media_a, events)
    cache.commit(a, events)
    cache.release(a)
    b = cache.allocate(ids, media_b, events)
    assert b.cached_tokens == 4  # only the text block before the image
    ha, hb = cache.hashes_for(ids, media_a)[0], cache.hashes_for(ids, media_b)[0]
    assert ha[0] == hb[0] and ha[1] != hb[1]


def test_lru_eviction_emits_block_removed_lazily() -> None:
    cache = PrefixCache(block_size=BS, num_blocks=4)
    events: list = []
    a = cache.allocate(list(range(16)), [], events)
    cache.commit(a, events)
    cache.release(a)
    assert not any(isinstance(e, RemovedBlocks) for e in events)  # finishing removes nothing
    events.clear()
    b = cache.allocate(list(range(100, 108)), [], events)
    removed = [h for e in events if isinstance(e, RemovedBlocks) for h in e.block_hashes]
    assert len(removed) == 2 and set(removed) <= set(a.hashes)
    # the tail blocks of the finished request go first, the shared prefix survives longest
    assert removed == [a.hashes[3], a.hashes[2]]
    cache.release(b)
    cache.reset(events)
    assert isinstance(events[-1], AllCleared)


def test_wire_encodings_decode_with_an_independent_decoder() -> None:
    events = [StoredBlocks([2**64 - 5], None, [1, 2], 2, [[("ab12", 0)]]),
              RemovedBlocks([2**64 - 5]), AllCleared()]
    for legacy in (False, True):
        ts, decoded, rank = decode_payload(encode_batch(1.5, events, legacy))
        assert ts == 1.5 and rank == 0
        assert [e["type"] for e in decoded] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
        stored = decoded[0]
        assert stored["block_hashes"] == [2**64 - 5]  # unsigned 64-bit, as vLLM sends
        assert stored["token_ids"] == [1, 2] and stored["block_size"] == 2
        assert stored["extra_keys"] == [[["ab12", 0]]]
        assert stored["medium"] == "GPU"


def expander(family: str, drift: int = 0) -> Expander:
    model = MODELS[family]
    return Expander(model, model.processor_config, lambda t: [ord(c) for c in t], drift)


def test_kimi_k3_worker_expansion_builds_the_dims_block() -> None:
    e = expander("kimi-k3")
    tid = MODELS["kimi-k3"].token_id
    ids = [7, tid("<|media_pad|>"), 8]
    out, spans = e.expand(ids, [DecodedImage(640, 480, "x", 0)])
    dims = [ord(c) for c in "image 640x480"]
    assert out[:3] == [7, tid("<|media_begin|>"), *dims[:1]]
    assert out.count(tid("<|media_pad|>")) == 414
    assert spans == [MediaSpan("x", 1, 414 + 3 + len(dims))]
    assert out[-2:] == [tid("<|media_end|>"), 8]


def test_count_drift_changes_the_workers_n() -> None:
    pad = MODELS["qwen3-vl"].token_id("<|image_pad|>")
    out, _ = expander("qwen3-vl", drift=3).expand([1, pad, 2], [DecodedImage(640, 480, "x", 0)])
    assert out.count(pad) == 303
    with pytest.raises(PlaceholderMismatch):
        expander("qwen3-vl").expand([1, 2], [DecodedImage(64, 64, "x", 0)])


def test_media_identifiers_and_refusals() -> None:
    red = decode_image(png_data_url(64, 64, (255, 0, 0)), "m")
    blue = decode_image(png_data_url(64, 64, (0, 0, 255)), "m")
    assert (red.width, red.height) == (64, 64)
    assert len(red.identifier) == 64 and red.identifier != blue.identifier
    with pytest.raises(MediaError, match="decode"):
        decode_image("data:image/png;base64,aGVsbG8=", "m")
    with pytest.raises(MediaError, match="larger"):
        decode_image(png_data_url(64, 64, (1, 2, 3)), "m", max_bytes=10)
    with pytest.raises(MediaError, match="allowed"):
        decode_image("http://example.com/a.png", "m")
    with pytest.raises(MediaError, match="exceeds"):
        decode_image(png_data_url(300, 300, (1, 2, 3)), "m", max_pixels=1000)


def test_model_dirs_render_each_familys_anchor(tmp_path: Path) -> None:
    import jinja2
    from mmlens.demo.model_dirs import ensure_model_dir
    from tokenizers import Tokenizer

    for family, model in MODELS.items():
        d = ensure_model_dir(family, tmp_path)
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        text = jinja2.Environment().from_string(cfg["chat_template"]).render(
            messages=[{"role": "user", "content": [{"type": "image_url"},
                                                   {"type": "text", "text": "hi"}]}],
            add_generation_prompt=True)
        ids = Tokenizer.from_file(str(d / "tokenizer.json")).encode(
            text, add_special_tokens=False).ids
        assert ids.count(model.token_id(model.core.anchor)) == 1, family
        assert json.loads((d / "config.json").read_text())["model_type"] == model.model_type


def test_engine_queues_requests_when_the_cache_is_full() -> None:
    import asyncio

    from mmlens.demo.engine import Engine, EngineError, LatencyModel
    from mmlens.demo.worker_metrics import WorkerMetrics

    class NoPublisher:
        async def publish(self, events: list) -> None:
            pass

        def load_changed(self) -> None:
            pass

    async def scenario() -> tuple[int, list[str], str]:
        engine = Engine(PrefixCache(block_size=4, num_blocks=6), NoPublisher(),  # type: ignore[arg-type]
                        WorkerMetrics("m", 4, 6, 1000), list(range(500, 530)),
                        LatencyModel(base_s=0.02))

        async def consume(rid: str, prompt: list[int]) -> str:
            finish = ""
            async for _, step in engine.run(rid, prompt, [], 2):
                finish = step.finish_reason
            return finish

        a = asyncio.create_task(consume("a", list(range(16))))  # 4 of 6 blocks
        await wait_until_async(lambda: engine.running == 1, 5, what="a running")
        b = asyncio.create_task(consume("b", list(range(100, 116))))  # must wait for a
        queued = await wait_until_async(lambda: engine.waiting, 5, what="b queued")
        finishes = list(await asyncio.gather(a, b))
        try:
            await consume("c", list(range(200, 240)))  # 10 blocks can never fit
        except EngineError as exc:
            return queued, finishes, str(exc)
        return queued, finishes, ""

    queued, finishes, error = asyncio.run(scenario())
    assert queued == 1  # b waited for a's blocks instead of failing
    assert finishes == ["length", "length"]  # both ran, max_tokens 2
    assert "does not fit" in error
