"""The verdict job on recorded stores: the log + KV events store of a live acceptance run
(real SMG 1.13, two stand-in engines, 224 requests at 16 in flight, w2 killed with SIGKILL
after 150 answers), its verdicts deleted and judged again tick by tick, against the truth
the engines' own logs gave (``tests.observed.rejudge``)."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

from tests.observed.acceptance import Tally
from tests.observed.rejudge import rejudge

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"


def _judged(tmp_path: Path, name: str, engine: str | None = None,
            ) -> tuple[dict[str, str], Tally]:
    """The recorded store ``name`` judged again (its workers' engine set to ``engine``)."""
    db = tmp_path / "logs+kv.db"
    with gzip.open(CAPTURES / f"{name}_store.db.gz") as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    if engine is not None:
        con = sqlite3.connect(db)
        targets = json.loads(con.execute("SELECT value FROM meta WHERE key = 'targets'")
                             .fetchone()[0])
        for w in targets["workers"]:
            w["engine"] = engine
        con.execute("UPDATE meta SET value = ? WHERE key = 'targets'", (json.dumps(targets),))
        con.commit()
        con.close()
    truth = json.loads((CAPTURES / f"{name}_truth.json").read_text())
    got = rejudge(db)
    tally = Tally()
    for rid, category in truth.items():
        tally.add(rid, got.get(rid), category)
    return got, tally


def test_a_failed_attempts_blocks_are_not_read_as_another_requests(tmp_path: Path) -> None:
    """Eight requests failed over from w2 when it died. Before it died, its engine stored
    blocks that only a failed attempt's prompt can have computed; read as the prefill of
    acc-145 (one length with it, on w2; its engine found 112 tokens cached), they made it a
    false hit. A failed attempt's run now competes for them: every definite verdict right.
    The stand-in engines of this run cached a prompt after its prefill and stored a block
    once, as SGLang's radix tree does (not as vLLM, which the stand-in now follows): judged
    as such an engine's (as vLLM's, 8 are wrong)."""
    got, tally = _judged(tmp_path, "smg_1.13_verdicts", engine="sglang")
    assert tally.wrong == 0, tally.wrong_examples
    assert tally.unknown == 0 and tally.total == 224
    assert got["acc-145"] in ("hit", "hit_or_false_hit")
    assert tally.definite >= 140  # the recorded run's 148 (stored live: 131)


def test_a_vllm_run_read_as_vllm_stores_every_block_it_computes(tmp_path: Path) -> None:
    """A run of the stand-in that behaves as vLLM (a prompt's blocks cached and announced
    when allocated, a block computed again stored beside the first): a request that stored
    nothing found its prompt cached, the blocks below its own segment were found, not
    computed alongside another request. Read as an engine that stores a block once (the
    readings ``announces_all`` rules out kept), fewer verdicts are definite. Image sizes
    learned from every request around (later ones, other workers') settle same-length
    requests of other sizes at once, and a two-reading verdict is judged again once more
    sizes are known: 220 definite (201 from each pass's own sizes, 207 without judging
    again)."""
    _, vllm = _judged(tmp_path, "smg_1.13_vllm_copies")
    assert vllm.wrong == 0, vllm.wrong_examples
    assert vllm.unknown == 0 and vllm.total == 224
    assert vllm.definite >= 215, vllm
    _, once = _judged(tmp_path, "smg_1.13_vllm_copies", engine="sglang")
    assert once.wrong == 0, once.wrong_examples
    assert vllm.definite >= once.definite + 10, (vllm, once)  # 220 and 206
