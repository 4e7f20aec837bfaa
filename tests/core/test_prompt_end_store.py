"""Where a prompt ended in a one-block store: marked by the resident index for a worker whose
model it knows, stored in the event's content (no token stored), read back by the verdict
job's chain tail, on SQLite and PostgreSQL."""

from __future__ import annotations

from mmlens.ingest.kv_index import ResidentIndex
from mmlens.ingest.prompt_end import generation_prompt, suffix_bytes
from mmlens.records import BlockStored
from mmlens.store.open import open_store
from mmlens.store.tail import IdTail

GEN = [151644, 77091, 198]  # Qwen's <|im_start|>assistant\n


def test_qwen_generation_prompt_is_its_assistant_header() -> None:
    assert generation_prompt("qwen3-vl") == tuple(GEN)


def test_a_decode_blocks_prompt_end_is_stored_and_read_back(store_db: str) -> None:
    prompt = [*range(1000, 1016), 7, 8, 9, 151645, 198, *GEN]  # 16 + 8 tokens
    decode = prompt[16:] + list(range(400, 408))
    events = [BlockStored("w1", 0, 1, 10.0, [1], None, prompt[:16], 16),
              BlockStored("w1", 0, 2, 10.5, [2], 1, decode, 16),
              BlockStored("w2", 0, 1, 10.5, [3], None, decode, 16)]  # no model told
    index = ResidentIndex()
    index.prompt_suffixes["w1"] = suffix_bytes(GEN)
    index.apply(events)
    assert [ev.prompt_end for ev in events] == [None, 8, None]
    store = open_store(store_db)
    try:
        store.add_kv_events(events)
        rows = store.kv_chain_tail(IdTail())
    finally:
        store.close()
    assert [(r[1], r[4], r[6]) for r in rows] == [("w1", ["1"], None), ("w1", ["2"], 8),
                                                  ("w2", ["3"], None)]


def test_a_prompt_that_ends_one_token_into_its_decode_block() -> None:
    """A prompt of 16·2 + 1 tokens: its last full block ends ``<|im_start|>assistant`` and the
    decode block opens with the newline. The block alone says nothing (a reply may begin
    with a newline); the index remembers the block it hangs off, so it names the end: 1. A
    block hung off one that does not end so stays unread."""
    prompt = [*range(1000, 1028), 151645, 198, *GEN]  # 32 + 1 tokens
    decode = [prompt[32], *range(400, 415)]
    other = [*range(2000, 2016)]
    events = [BlockStored("w1", 0, 1, 10.0, [1, 2], None, prompt[:32], 16),
              BlockStored("w1", 0, 2, 10.5, [3], 2, decode, 16),
              BlockStored("w1", 0, 3, 10.6, [4], None, other, 16),
              BlockStored("w1", 0, 4, 10.7, [5], 4, decode, 16)]
    index = ResidentIndex()
    index.prompt_suffixes["w1"] = suffix_bytes(GEN)
    index.apply(events)
    assert [ev.prompt_end for ev in events] == [None, 1, None, None]
