"""The engine-side content chain (``event_chain``, with its inlined fast paths) equals the
chain built block by block from the generic steps, for text, image runs, pad values and
several images per block."""

import random

import pytest

from mmlens.layout.content_keys import (
    IMAGE_TOKEN,
    ROOT,
    combine,
    event_chain,
    identity_step,
    masked_block,
    shape_step,
)


def reference(state, tokens, bs, images):
    shape, ident = state & ((1 << 64) - 1), state >> 64
    states, shapes, keys = [], [], []
    for b in range(len(tokens) // bs):
        block = tokens[b * bs:(b + 1) * bs]
        refs = images[b] if images and b < len(images) else None
        if refs:
            shape = shape_step(shape, masked_block(block, refs), [o for _, o in refs])
            ident = identity_step(ident, [i for i, _ in refs])
        else:
            shape = shape_step(shape, masked_block(block, ()))
        shapes.append(shape)
        states.append(shape | ident << 64)
        keys.append(combine(shape, ident))
    return states, shapes, keys


def random_event(rng, bs):
    n = rng.randint(1, 8)
    tokens = [rng.randrange(151000) for _ in range(n * bs)]
    images = []
    for b in range(n):
        kind = rng.random()
        if kind < 0.4:
            images.append(None)
            continue
        pad = rng.choice([151655, rng.randrange(1_000_000, 2_000_000)])
        start = rng.choice([0, 0, rng.randrange(bs)])
        tokens[b * bs + start:(b + 1) * bs] = [pad] * (bs - start)
        if rng.random() < 0.2:  # a stray token in the run: the block is not all masked
            tokens[b * bs + rng.randrange(bs)] = rng.randrange(100)
        off = start if start else rng.choice([0, -bs * b - 3, None])
        refs = [(f"{rng.getrandbits(64):016x}", off)]
        if kind > 0.9:
            refs.append((f"{rng.getrandbits(64):016x}", rng.randrange(bs)))
        images.append(tuple(refs))
    return tokens, images


@pytest.mark.parametrize("bs", [1, 4, 16])
def test_event_chain_equals_the_generic_steps(bs):
    rng = random.Random(bs)
    for _ in range(400):
        tokens, images = random_event(rng, bs)
        state = rng.choice([ROOT, rng.getrandbits(64), rng.getrandbits(128)])
        got = event_chain(state, tokens, bs, images)
        want = reference(state, tokens, bs, images)
        assert got[1] == want[1] and got[2] == want[2]
        assert [s & ((1 << 64) - 1) for s in got[0]] == want[1]
        assert [s >> 64 for s in got[0]] == [s >> 64 for s in want[0]]


def test_a_covered_block_is_masked_whatever_its_pad_value():
    a = event_chain(ROOT, [7] * 16, 16, [(("img", -16),)])
    b = event_chain(ROOT, [9] * 16, 16, [(("img", 0),)])
    c = event_chain(ROOT, [IMAGE_TOKEN] * 16, 16, [(("img", None),)])
    assert a == b == c
    assert event_chain(ROOT, [9] * 16, 16, [(("img", 3),)]) != a
