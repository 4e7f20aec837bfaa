import dataclasses

import pytest
import xxhash

from mmlens.errors import LayoutError
from mmlens.layout.composition import ImageInput, build_layout, compose
from mmlens.layout.families import get_family
from mmlens.layout.hashing import (
    block_hashes,
    dynamo_hash_hex,
    dynamo_mm_hash_url,
    dynamo_pad_value,
    dynamo_routing,
    smg_block_hashes,
    smg_identifier,
    vllm_extra_keys,
)
from mmlens.layout.tokenizers import TextTokenizer, family_tokenizer

QWEN3 = get_family("qwen3-vl")


def test_dynamo_pad_value_worked_example():
    assert dynamo_pad_value(17365620509079423308) == 335154060
    assert dynamo_hash_hex(17365620509079423308) == "f0ff13d893eac94c"


def test_dynamo_mm_hash_is_xxh3_of_the_url_string_as_dynamo_1_6_1_logged():
    assert dynamo_mm_hash_url("http://127.0.0.1:18080/red64.png") == 10648623911278999132
    # Same bytes, other URL: another identity.
    assert dynamo_mm_hash_url("http://127.0.0.1:18080/red64.png?v=2") != 10648623911278999132


def toy_tokenizer():
    vocab = {tok: 1000 + i for i, tok in enumerate(QWEN3.special_ids)}
    vocab["<|image_pad|>"] = 99
    return TextTokenizer(None, vocab.get, str, synthetic=True, source="toy")


def test_dynamo_routing_matches_its_unit_test():
    # tokens [10,99,11,99,12], placeholder 99, counts [2,3], BOS 1, block 4
    family = dataclasses.replace(QWEN3, count=lambda w, h, p: w)
    layout = build_layout(family, [10, 99, 11, 99, 12], [ImageInput(2, 1), ImageInput(3, 1)],
                          toy_tokenizer(), block_size=4)
    h1, h2 = 5, (1 << 30) + 7
    routing = dynamo_routing(layout, [h1, h2], bos_id=1)
    p1, p2 = 1_000_005, 1_000_007
    assert list(routing.routing_ids) == [1, 10, p1, p1, 11, p2, p2, p2, 12, 0, 0, 0]
    assert routing.expanded_prompt_len == 9
    assert len(routing.block_hashes) == 3


def test_dynamo_qwen3_64px_routing_blocks():
    layout = compose(QWEN3, [ImageInput(64, 64), "Describe this image in detail please."],
                     family_tokenizer("qwen3-vl"))
    routing = dynamo_routing(layout, [17365620509079423308])
    assert routing.expanded_prompt_len == 81
    assert len(routing.routing_ids) == 96 and len(routing.block_hashes) == 6
    assert routing.routing_ids[4:68] == (335154060,) * 64


def test_block_hash_is_xxh3_seed_1337_over_le_u32():
    ids = list(range(40))
    hashes = block_hashes(ids, 16)
    assert len(hashes) == 2  # the 8-token tail is not hashed
    raw = b"".join(i.to_bytes(4, "little") for i in range(16))
    assert hashes[0] == xxhash.xxh3_64_intdigest(raw, 1337)


def test_smg_hashes_are_content_blind_and_dynamo_hashes_are_not():
    tok = family_tokenizer("qwen3-vl")
    red = compose(QWEN3, [ImageInput(64, 64), "same text"], tok)
    blue = compose(QWEN3, [ImageInput(224, 224), "same text"], tok)  # also 64 tokens
    assert smg_block_hashes(red) == smg_block_hashes(blue)
    assert (dynamo_routing(red, [1]).block_hashes[:4]
            != dynamo_routing(blue, [2]).block_hashes[:4])
    # The image starts at offset 4, so even block 0 differs under Dynamo.
    assert dynamo_routing(red, [1]).block_hashes[0] != dynamo_routing(blue, [2]).block_hashes[0]


def test_smg_identifier_is_blake3_of_raw_bytes():
    assert smg_identifier(b"abc") == (
        "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85")


def test_vllm_extra_keys_worked_example():
    layout = compose(QWEN3, [ImageInput(64, 64), "Describe this image in detail please."],
                     family_tokenizer("qwen3-vl"))
    keys = vllm_extra_keys(layout.router, ["img"], 16)
    assert keys == [(("img", 4),), (("img", -12),), (("img", -28),), (("img", -44),),
                    (("img", -60),)]


def test_vllm_extra_keys_name_both_images_in_a_shared_block():
    tok = family_tokenizer("qwen3-vl")
    layout = compose(QWEN3, [ImageInput(64, 64), ImageInput(64, 64), "x"], tok)
    keys = vllm_extra_keys(layout.router, ["a", "b"], 16)
    shared = [k for k in keys if k and len(k) == 2]
    assert shared and {name for name, _ in shared[0]} == {"a", "b"}


def test_identity_count_must_match_images():
    layout = compose(QWEN3, [ImageInput(64, 64), "x"], family_tokenizer("qwen3-vl"))
    with pytest.raises(LayoutError):
        dynamo_routing(layout, [1, 2])
    with pytest.raises(LayoutError):
        vllm_extra_keys(layout.router, [], 16)


def test_frontend_decoding_identity_follows_pixels_not_encoding():
    import io

    from PIL import Image

    from mmlens.layout.hashing import dynamo_mm_hash_decoded
    from mmlens.layout.imageinfo import decoded_rgb, to_data_url

    img = Image.new("RGB", (32, 16), (9, 99, 199))
    png, bmp = io.BytesIO(), io.BytesIO()
    img.save(png, format="PNG")
    img.save(bmp, format="BMP")
    # URL passthrough: two encodings of one picture are two identities...
    assert (dynamo_mm_hash_url(to_data_url(png.getvalue(), "PNG"))
            != dynamo_mm_hash_url(to_data_url(bmp.getvalue(), "BMP")))
    # ...frontend decoding hashes the pixels, so they agree; blake3 of raw bytes does not.
    assert (dynamo_mm_hash_decoded(decoded_rgb(png.getvalue()))
            == dynamo_mm_hash_decoded(decoded_rgb(bmp.getvalue())))
    assert smg_identifier(png.getvalue()) != smg_identifier(bmp.getvalue())


def test_llava_routing_bos_worked_example():
    # A 20-token rendered prompt with one <image>: 20 − 1 + 576 = 595 engine tokens; Dynamo's
    # routing view prepends the BOS when add_bos_token is set: 596.
    llava = get_family("llava-1.5")
    tok = family_tokenizer("llava-1.5")
    anchor = tok.token_id("<image>")
    rendered = [5] * 9 + [anchor] + [6] * 10
    layout = build_layout(llava, rendered, [ImageInput(640, 480)], tok)
    assert layout.engine_prompt_tokens == 595
    routing = dynamo_routing(layout, [42], bos_id=tok.token_id("<s>"))
    assert routing.expanded_prompt_len == 596
    assert routing.routing_ids[0] == 1 and len(routing.routing_ids) == 608
