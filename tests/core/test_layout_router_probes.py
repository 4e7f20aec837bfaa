"""mmlens' per-router views against what the real SMG 1.13 and Dynamo 1.6.1 did
(tests/fixtures/router_probes, recorded by `python -m mmlens.demo.probe_routers`).

Per family and router: a few hundred random image sizes (tiny, ordinary, skinny, extreme
over 200:1, large, huge) with the demo model's processor config, 23 fixed sizes under each
processor-config variant, and multi-part messages (rendering, placeholder offsets and the
identities the router forwarded)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from mmlens.layout.composition import ImageInput
from mmlens.layout.families import get_family
from mmlens.layout.hashing import dynamo_hash_hex, dynamo_mm_hash_url, smg_identity_of_digest
from mmlens.layout.imageinfo import decode_data_url
from mmlens.layout.modeldir import Model
from mmlens.layout.router_views import party_view
from mmlens.layout.routers import SMG_TRANSPARENCY, Party, count_images, count_rule
from mmlens.layout.tokenizers import family_tokenizer

FOLDER = Path(__file__).resolve().parent.parent / "fixtures" / "router_probes"
PROBES = {p.stem: json.loads(p.read_text()) for p in sorted(FOLDER.glob("*.json"))}
MAIN = [k for k in PROBES if not k.endswith("-tokenizer")]


def merged_config(probe: Mapping[str, Any], processor: Mapping[str, Any]) -> dict[str, Any]:
    """As a model directory gives it: config.json's vision keys, then the processor file."""
    cfg = probe["config_json"]
    return {**{k: cfg[k] for k in ("vision_config",) if k in cfg}, **processor}


def predicted(probe: Mapping[str, Any], processor: Mapping[str, Any],
              sizes: list[tuple[int, int]]) -> list[int | str | None]:
    """mmlens' N per size for the probe's router: an int, "refuse", or None (not counted)."""
    family = get_family(probe["family"])
    party = Party(probe["router"])
    rule = count_rule(party, family)
    if rule is None:
        return [None] * len(sizes)
    counts = count_images(rule, family, sizes, merged_config(probe, processor), 20).counts
    return ["refuse" if c.refusal else c.tokens for c in counts]


def observed(probe: Mapping[str, Any], obs: Mapping[str, Any]) -> int | str | None:
    if probe["router"] == "smg":
        return obs["n"] if obs["status"] == 200 else "refuse"
    if not probe["mm_routing"].get("exact"):
        assert obs["n"] == [], obs  # text-prefix fallback: Dynamo counted nothing
        return None
    (n,) = obs["n"]
    return n


def agreement(probe: Mapping[str, Any], processor: Mapping[str, Any],
              observations: list[dict[str, Any]]) -> tuple[int, list[Any]]:
    sizes = [(o["w"], o["h"]) for o in observations]
    mine = predicted(probe, processor, sizes)
    theirs = [observed(probe, o) for o in observations]
    bad = [(s, m, t) for s, m, t in zip(sizes, mine, theirs, strict=True) if m != t]
    return len(sizes) - len(bad), bad


def test_every_family_and_router_was_probed():
    assert set(MAIN) == {f"{r}-{f}" for r in ("smg", "dynamo")
                         for f in ("qwen3-vl", "glm-5.3-flash", "kimi-k3")}
    for key in MAIN:
        kinds = {o["kind"] for o in PROBES[key]["counts"]}
        assert {"tiny", "extreme", "huge"} <= kinds, key
        assert len(PROBES[key]["counts"]) >= 200, key


@pytest.mark.parametrize("key", MAIN)
def test_counts_and_refusals_equal_the_router(key):
    probe = PROBES[key]
    agree, bad = agreement(probe, probe["processor_config"], probe["counts"])
    assert not bad, f"{key}: {agree}/{len(probe['counts'])} agree; first misses {bad[:5]}"


@pytest.mark.parametrize("key", MAIN)
def test_processor_config_variants_equal_the_router(key):
    probe = PROBES[key]
    for tag, variant in probe.get("variants", {}).items():
        agree, bad = agreement(probe, variant["processor_config"], variant["counts"])
        assert not bad, f"{key}/{tag}: {agree}/{len(variant['counts'])}; misses {bad[:5]}"


@pytest.mark.parametrize("family", ["qwen3-vl", "glm-5.3-flash", "kimi-k3"])
def test_smg_identities_are_the_rekeyed_blake3_of_the_bytes(family):
    probe = PROBES[f"smg-{family}"]
    policy = SMG_TRANSPARENCY[family]
    pairs = [(o["raw_blake3"], o["identity"]) for o in probe["counts"] if o["status"] == 200]
    pairs += [(raw, ident) for m in probe["messages"].values() if m["status"] == 200
              for raw, ident in zip(m["raw_blake3"], m["identities"], strict=True)]
    assert len(pairs) >= 190
    assert [smg_identity_of_digest(raw, policy) for raw, _ in pairs] == [i for _, i in pairs]
    # The re-keying matters: plain blake3 is right for Kimi-K3 only.
    plain = sum(raw == ident for raw, ident in pairs)
    assert plain == (len(pairs) if policy is None else 0)


def demo_model(probe: Mapping[str, Any]) -> Model:
    family = get_family(probe["family"])
    return Model(family, family_tokenizer(family.name),
                 merged_config(probe, probe["processor_config"]))


def message_parts(message: Mapping[str, Any]) -> list[Any]:
    shape = message["shape"]
    if isinstance(shape, str):
        return [shape]
    urls = iter(message.get("urls") or [])
    parts: list[Any] = []
    for p in shape:
        if isinstance(p, list):
            url = next(urls, None)
            parts.append(ImageInput(p[0], p[1], data=decode_data_url(url) if url else None,
                                    url=url))
        else:
            parts.append(p)
    return parts


@pytest.mark.parametrize("family", ["qwen3-vl", "glm-5.3-flash", "kimi-k3"])
def test_smg_expanded_prompts_equal_the_router_view(family):
    probe = PROBES[f"smg-{family}"]
    model = demo_model(probe)
    for tag, message in probe["messages"].items():
        view = party_view(Party.SMG, model, message_parts(message), 16)
        assert view.layout is not None
        assert list(view.layout.router.token_ids) == message["ids"], tag
        if get_family(family).name != "kimi-k3":
            got = [(im.offset, im.tokens) for im in view.images]
            assert got == [(p["offset"], p["length"]) for p in message["placeholders"]], tag


@pytest.mark.parametrize("family", ["qwen3-vl", "glm-5.3-flash", "kimi-k3"])
def test_dynamo_rendering_and_identities_equal_the_router_view(family):
    probe = PROBES[f"dynamo-{family}"]
    model = demo_model(probe)
    for tag, message in probe["messages"].items():
        parts = message_parts(message)
        view = party_view(Party.DYNAMO, model, parts, 16, probe["tokenizer_backend"])
        assert list(view.rendered_ids) == message["ids"], tag
        urls = message.get("urls") or []
        if view.outcome == "exact":
            assert message["identities"] == [dynamo_hash_hex(dynamo_mm_hash_url(u))
                                              for u in urls], tag
            assert [im.identity for im in view.images] == message["identities"], tag
            if urls:
                assert view.routed_tokens == message["routing_len"], tag
        else:
            assert view.outcome == "fallback" and message["n"] == [], tag


@pytest.mark.parametrize(("backend", "outcome"), [("default", "refuse"),
                                                  ("fastokens", "fallback")])
def test_kimi_k3_with_other_dynamo_tokenizer_backends(backend, outcome):
    probe = PROBES[f"dynamo-kimi-k3-{backend}-tokenizer"]
    assert probe["tokenizer_backend"] == backend
    model = demo_model(probe)
    statuses = {o["status"] for o in probe["counts"]}
    statuses |= {m["status"] for m in probe["messages"].values()}
    for tag, message in probe["messages"].items():
        view = party_view(Party.DYNAMO, model, message_parts(message), 16, backend)
        assert view.outcome == outcome, tag
        if outcome == "fallback":
            assert list(view.rendered_ids) == message["ids"], tag
            assert all(im.tokens is None for im in view.images), tag  # not routed on
    if outcome == "refuse":  # every request, text only too, fails in the frontend
        assert statuses == {500}
    else:  # routed on the text, but each image still counted (for metrics only)
        assert statuses == {200}
        sizes = [(o["w"], o["h"]) for o in probe["counts"]]
        rule = count_rule(Party.DYNAMO, model.family)
        assert rule is not None
        counted = count_images(rule, model.family, sizes, model.processor_config, 20).counts
        assert [o["n"] for o in probe["counts"]] == [[c.tokens] for c in counted]
