import dataclasses

import pytest

from mmlens.errors import LayoutError
from mmlens.layout.composition import ImageInput, SpanKind, build_layout, compose
from mmlens.layout.families import get_family
from mmlens.layout.tokenizers import TextTokenizer, family_tokenizer

QWEN3 = get_family("qwen3-vl")
TEXT = "Describe this image in detail please."
# What SMG 1.13.0 sent a vLLM worker for a 64×64 image + TEXT (routers-smg.md §8.3).
SMG_81 = [151644, 872, 198, 151652, *[151655] * 64, 151653,
          74785, 419, 2168, 304, 7716, 4486, 13, 151645, 198, 151644, 77091, 198]


def qwen3_layout(*parts, **kw):
    return compose(QWEN3, list(parts), family_tokenizer("qwen3-vl"), **kw)


def test_qwen3_64px_matches_what_smg_sent_the_worker():
    layout = qwen3_layout(ImageInput(64, 64), TEXT)
    assert len(layout.anchor) == 18
    assert list(layout.router.token_ids) == SMG_81
    assert layout.engine_prompt_tokens == 81
    (image,) = layout.router.image_spans()
    assert (image.start, image.length, image.image_index) == (4, 64, 0)
    blocks = layout.blocks()
    assert sum(b.full for b in blocks) == 5 and not blocks[-1].full
    assert [b.image_indices for b in blocks[:6]] == [(0,)] * 5 + [()]


def test_worker_view_is_the_unexpanded_prompt_with_one_anchor_per_image():
    layout = qwen3_layout(ImageInput(640, 480), "and", ImageInput(64, 64), TEXT)
    anchors = [s for s in layout.worker.spans if s.kind is SpanKind.ANCHOR]
    assert [a.image_index for a in anchors] == [0, 1]
    assert all(layout.worker.token_ids[a.start] == 151655 for a in anchors)
    # expanded = rendered − anchors + ΣN
    assert len(layout.router) == len(layout.anchor) - 2 + 300 + 64


def test_spans_tile_the_view_without_gaps():
    layout = qwen3_layout(ImageInput(1280, 720), "x", ImageInput(224, 224), TEXT)
    for view in (layout.anchor, layout.router, layout.engine):
        pos = 0
        for span in view.spans:
            assert span.start == pos and span.length > 0
            pos = span.end
        assert pos == len(view)


def test_count_drift_marks_the_first_divergent_block():
    layout = qwen3_layout(ImageInput(640, 480), TEXT, engine_count_drift=4)
    assert layout.engine_prompt_tokens == len(layout.router) + 4
    # The image run starts at 4 and has 300 tokens: ids first differ at 304 → block 19.
    assert layout.first_divergent_block() == 304 // 16
    assert qwen3_layout(ImageInput(640, 480), TEXT).first_divergent_block() is None


def test_engine_processor_config_can_differ_from_the_routers():
    kimi = get_family("kimi-k2.5")
    layout = compose(kimi, [ImageInput(1280, 720), "hi"], family_tokenizer("kimi-k2.5"),
                     engine_processor_config={"media_proc_cfg": {"in_patch_limit": 4096,
                                                                  "patch_limit_on_one_side": 64}})
    assert layout.images[0].tokens == 1196
    assert layout.images[0].engine_tokens == 576
    assert layout.engine_prompt_tokens == len(layout.router) - 620


def test_kimi_k3_block_carries_the_pre_resize_dims_text():
    tok = family_tokenizer("kimi-k3")
    layout = compose(get_family("kimi-k3"), [ImageInput(4000, 3000), "hi"], tok)
    dims = tok.encode("image 4000x3000")
    img = layout.images[0]
    assert img.tokens == 15444
    assert img.expanded_length == 15444 + 3 + len(dims)
    ids = layout.router.token_ids
    begin = ids.index(tok.token_id("<|media_begin|>"))
    assert list(ids[begin + 1:begin + 1 + len(dims)]) == dims
    assert ids[begin + 1 + len(dims)] == tok.token_id("<|media_content|>")
    assert ids[begin + 2 + len(dims) + 15444] == tok.token_id("<|media_end|>")


def test_llama4_tiles_and_separators():
    tok = family_tokenizer("llama-4")
    layout = compose(get_family("llama-4"), [ImageInput(640, 480), "hi"], tok)
    img = layout.images[0]
    assert img.expanded_length == 727
    assert img.tokens == 5 * 144  # four tiles and the global tile
    ids = layout.router.token_ids
    assert ids.count(tok.token_id("<|tile_x_separator|>")) == 2
    assert ids.count(tok.token_id("<|tile_y_separator|>")) == 2
    assert len(layout.router.image_spans(0)) == 5


def test_qwen2_router_pads_with_vision_pad_while_the_engine_uses_image_pad():
    layout = compose(get_family("qwen2-vl"), [ImageInput(640, 480), TEXT],
                     family_tokenizer("qwen2-vl"))
    (router_run,) = layout.router.image_spans()
    (engine_run,) = layout.engine.image_spans()
    assert set(layout.router.token_ids[router_run.start:router_run.end]) == {151654}
    assert set(layout.engine.token_ids[engine_run.start:engine_run.end]) == {151655}
    assert layout.first_divergent_block() == 0


def test_anchor_count_must_match_image_count():
    tok = family_tokenizer("qwen3-vl")
    rendered = tok.encode(QWEN3.chat.render([None, TEXT, None]))
    with pytest.raises(LayoutError, match=r"2 image anchor.* 1 image"):
        build_layout(QWEN3, rendered, [ImageInput(64, 64)], tok)


def test_anchor_in_text_is_refused():
    with pytest.raises(LayoutError, match="anchor"):
        qwen3_layout("look <|image_pad|> here", ImageInput(64, 64))


def test_too_many_images_is_refused():
    with pytest.raises(LayoutError, match="at most 4 images"):
        compose(get_family("llava-1.5"), [ImageInput(64, 64)] * 5, family_tokenizer("llava-1.5"))


def test_zero_block_size_is_refused():
    with pytest.raises(LayoutError, match="block size"):
        qwen3_layout(ImageInput(64, 64), TEXT, block_size=0)


def test_glm53_needs_its_processor_config():
    with pytest.raises(LayoutError, match="processor config"):
        compose(get_family("glm-5.3-flash"), [ImageInput(64, 64)],
                family_tokenizer("glm-5.3-flash"))


def toy_tokenizer() -> TextTokenizer:
    vocab = {"<|image_pad|>": 99, "<|vision_start|>": 7, "<|vision_end|>": 8}
    for tok, idx in get_family("qwen3-vl").special_ids.items():
        vocab.setdefault(tok, 1000 + idx % 1000)
    return TextTokenizer(encode_fn=None, token_to_id_fn=vocab.get,
                         id_to_token_fn=lambda i: str(i), synthetic=True, source="toy")


def toy_family():
    # Image width stands for the image-token count, as in Dynamo's unit test.
    return dataclasses.replace(QWEN3, count=lambda w, h, p: w)


def test_toy_layout_matches_dynamos_unit_test_shape():
    layout = build_layout(toy_family(), [10, 99, 11, 99, 12],
                          [ImageInput(2, 1), ImageInput(3, 1)], toy_tokenizer(), block_size=4)
    assert list(layout.router.token_ids) == [10, 99, 99, 11, 99, 99, 99, 12]
    assert [(s.kind.value, s.start, s.length) for s in layout.router.spans] == [
        ("text", 0, 1), ("image", 1, 2), ("text", 3, 1), ("image", 4, 3), ("text", 7, 1)]
