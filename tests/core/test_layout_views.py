"""Per-router views: each party's rendering, counts, identities and outcome, and the
differences named with their cause (the observations behind them are pinned in
tests/fixtures/router_probes and checked by test_layout_router_probes.py)."""

from __future__ import annotations

import io
import random

import pytest
from PIL import Image

from mmlens.layout.composition import ImageInput
from mmlens.layout.families import get_family
from mmlens.layout.hashing import smg_identifier
from mmlens.layout.image_tokens import Glm5Params, glm5_tokens
from mmlens.layout.imageinfo import to_data_url
from mmlens.layout.modeldir import Model, resolve_model
from mmlens.layout.router_views import router_views
from mmlens.layout.routers import Party
from mmlens.layout.tokenizers import family_tokenizer

GLM_DEMO = {"min_pixels": 12544, "max_pixels": 11760000, "patch_size": 14, "merge_size": 2,
            "temporal_patch_size": 2}


def png(w: int, h: int, rgb: tuple[int, int, int] = (200, 30, 30)) -> ImageInput:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), rgb).save(buf, format="PNG")
    data = buf.getvalue()
    return ImageInput(w, h, data=data, url=to_data_url(data, "PNG"), format="PNG")


def glm(config: dict) -> Model:
    return Model(get_family("glm-5.3-flash"), family_tokenizer("glm-5.3-flash"), config)


def causes(views, party: str) -> dict[str, str]:
    return {d.cause: d.detail for d in views.differences if d.party.value == party}


def test_smg_moves_qwen_images_before_the_text():
    views = router_views(resolve_model("qwen3-vl"),
                         ["Compare", png(64, 64), "Which is taller?", png(224, 224, (1, 2, 3))])
    eng, smg, dyn = views.parties()
    assert [i.offset for i in eng.images] == [5, 75]
    assert [i.offset for i in smg.images] == [4, 70]  # both images first, text after
    assert [i.offset for i in dyn.images] == [5, 75]  # Dynamo keeps the order
    assert smg.prompt_tokens == eng.prompt_tokens  # totals equal, offsets not
    detail = causes(views, "smg")["part order"]
    assert "image 1 at token 70 (engine 75)" in detail
    assert "part order" not in causes(views, "dynamo")


def test_kimi_and_glm_keep_the_part_order_in_smg():
    for model in (resolve_model("kimi-k3"), glm(GLM_DEMO)):
        views = router_views(model, ["Compare", png(64, 64), "Which is taller?"])
        assert views.smg.rendered_ids == views.engine.rendered_ids
        assert "part order" not in causes(views, "smg")


def test_glm_tiny_side_differs_by_budget_keys_not_rounding():
    # SMG reads the checkpoint's top-level min_pixels (12544); HF's glm5_next reads only
    # min_image_tokens (default 16 tokens = 25088 pixels).
    views = router_views(glm(GLM_DEMO), [png(16, 256), "x"])
    assert views.smg.images[0].tokens == 10 and views.engine.images[0].tokens == 16
    diffs = causes(views, "smg")
    assert "min_pixels" in diffs["config key the engine ignores"]
    assert "config key" in diffs
    assert "16 tokens, engine" not in diffs["config key"]
    assert "smg 10 tokens, engine 16" in diffs["config key"]
    wide = router_views(glm(GLM_DEMO), [png(2281, 24), "x"])
    assert wide.smg.images[0].tokens == wide.engine.images[0].tokens == 82


def test_glm_size_budget_is_read_by_neither_and_said_so():
    config = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2,
              "size": {"shortest_edge": 50176, "longest_edge": 2007040}}
    views = router_views(glm(config), [png(4000, 3000), "x"])
    assert views.smg.images[0].tokens == views.engine.images[0].tokens == 7931
    neither = causes(views, "smg")["config key read by neither"]
    assert "size.shortest_edge" in neither and "size.longest_edge" in neither
    assert views.dynamo.outcome == "fallback"


def test_glm_extreme_aspect_smg_refuses_the_engine_expands_dynamo_falls_back():
    views = router_views(glm(GLM_DEMO), [png(4500, 20), "x"])
    assert views.engine.outcome == "expand" and views.engine.images[0].tokens == 161
    assert views.smg.outcome == "refuse" and "HTTP 400" in views.smg.reason
    assert views.dynamo.outcome == "fallback" and views.dynamo.images[0].tokens is None
    assert "no image processor registered" in views.dynamo.reason
    assert views.dynamo.routed_tokens == len(views.dynamo.rendered_ids)
    assert "refusal" in causes(views, "smg") and "fallback" in causes(views, "dynamo")


def test_qwen_extreme_aspect_every_party_says_what_it_does():
    views = router_views(resolve_model("qwen3-vl"), [png(4500, 20), "x"])
    assert views.engine.outcome == "refuse" and views.smg.outcome == "refuse"
    assert views.dynamo.outcome == "exact" and views.dynamo.images[0].tokens == 1
    assert "then the engine refuses" in views.dynamo.reason
    assert "engine refuses" in causes(views, "dynamo")


def test_dynamo_rounds_a_sub_half_cell_side_up_to_one_cell():
    views = router_views(resolve_model("qwen3-vl"), [png(2847, 15), "x"])
    assert (views.dynamo.images[0].tokens, views.engine.images[0].tokens) == (89, 111)
    assert views.smg.images[0].tokens == 111
    assert "image 0 (2847x15): dynamo 89 tokens, engine 111" in causes(views, "dynamo")[
        "rounding"]


def test_qwen_size_budget_is_honoured_by_every_party():
    config = {"patch_size": 16, "merge_size": 2,
              "size": {"shortest_edge": 200704, "longest_edge": 1003520}}
    model = Model(get_family("qwen3-vl"), family_tokenizer("qwen3-vl"), config)
    views = router_views(model, [png(224, 224), "x"])
    assert {v.images[0].tokens for v in views.parties()} == {196}
    assert not [d for d in views.differences if "config" in d.cause]


def test_kimi_k3_in_dynamo_needs_basetenkenizer_and_then_renders_its_own_format():
    model = resolve_model("kimi-k3")
    parts = ["Compare", png(640, 480), "Which is taller?"]
    default = router_views(model, parts)
    assert default.dynamo.outcome == "refuse"
    assert "HTTP 500" in default.dynamo.reason and "segmented encoding" in default.dynamo.reason
    baseten = router_views(model, parts, dynamo_backend="basetenkenizer")
    assert baseten.dynamo.outcome == "exact" and baseten.dynamo.images[0].tokens == 414
    detail = causes(baseten, "dynamo")["chat format"]
    delta = len(baseten.dynamo.rendered_ids) - len(baseten.engine.rendered_ids)
    assert delta > 300 and f"({delta:+d})" in detail
    fastokens = router_views(model, parts, dynamo_backend="fastokens")
    assert fastokens.dynamo.outcome == "fallback"
    assert fastokens.dynamo.rendered_ids == baseten.dynamo.rendered_ids  # the same format


def test_identities_per_router():
    img = png(64, 64)
    for family, plain in (("kimi-k3", True), ("qwen3-vl", False)):
        views = router_views(resolve_model(family), [img, "x"])
        assert (views.smg.images[0].identity == smg_identifier(img.data)) is plain
        assert len(views.dynamo.images[0].identity or "") == 16
        assert views.dynamo.images[0].pad_value is not None or family == "kimi-k3"


def test_views_flag_families_not_probed():
    views = router_views(resolve_model("llava-1.5"), [png(64, 64), "x"])
    assert views.engine.observed and not views.smg.observed and not views.dynamo.observed
    qwen2 = router_views(resolve_model("qwen2-vl"), [png(64, 64), "x"])
    assert qwen2.smg.outcome == "refuse" and "'<image>'" in qwen2.smg.reason
    assert router_views(resolve_model("glm-4v"), [png(64, 64), "x"]).smg.outcome == \
        "unsupported"


def test_party_views_of_a_text_only_message():
    views = router_views(resolve_model("qwen3-vl"), ["Hello", "world"])
    assert len(views.dynamo.rendered_ids) == len(views.engine.rendered_ids) + 1  # "\n"
    assert causes(views, "dynamo")["text join"]
    assert views.smg.rendered_ids == views.engine.rendered_ids
    assert all(v.party in Party for v in views.parties())


transformers = pytest.importorskip("transformers")


def test_engine_glm5_counts_equal_transformers_glm5_next():
    rng = random.Random(14)
    sizes = [(16, 256), (2281, 24), (4500, 20), (1, 257), (4000, 3000), (5000, 5000)]
    sizes += [(rng.randint(1, 6000), rng.randint(1, 6000)) for _ in range(60)]
    sizes += [(rng.randint(1, 40), rng.randint(1, 3000)) for _ in range(20)]
    for config in ({}, {"min_image_tokens": 64, "max_image_tokens": 1280},
                   {"min_pixels": 50176, "max_pixels": 2007040,
                    "size": {"shortest_edge": 50176, "longest_edge": 2007040}}):
        proc = transformers.Glm5NextImageProcessorPil.from_dict(dict(config))
        model = glm(config)
        for w, h in sizes:
            expected = proc.get_number_of_image_patches(h, w, {}) // 4
            views = router_views(model, [ImageInput(w, h), "x"])
            assert views.engine.images[0].tokens == expected, (config, w, h)


def test_glm5_budget_cut_is_a_bounded_search():
    # The cut searches the content height (log2 of the side), whatever the budget.
    for budget in (1 << 21, 1 << 40):
        n = glm5_tokens(16000, 65535, Glm5Params(max_pixels=budget))
        assert 0 < n * Glm5Params().pixels_per_token <= budget


def test_inspector_panel_rows():
    from mmlens.figures.router_views import router_panel

    panel = router_panel(resolve_model("qwen3-vl"), ["Compare", png(64, 64), "ok",
                                                     png(4500, 20)])
    assert [r["party"] for r in panel.parties] == ["engine (HF semantics)", "SMG 1.13",
                                                   "Dynamo 1.6.1"]
    engine, smg, dynamo = panel.parties
    assert (engine["outcome"], smg["outcome"], dynamo["outcome"]) == ("refuse", "refuse",
                                                                       "exact")
    assert dynamo["image tokens"] == "64, 1" and dynamo["blocks"] == dynamo["routed on"] // 16
    assert smg["image offsets"] == "4, 7"  # refused: the anchors, images first
    # The engine refuses too, so SMG's refusal is an outcome, not a difference.
    assert {d["cause"] for d in panel.differences} == {"part order", "engine refuses"}
    assert any(n.startswith("smg: HTTP 400") for n in panel.notes)
