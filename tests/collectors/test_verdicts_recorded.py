"""The verdict job on a recorded store: the log + KV events store of one live acceptance run
(real SMG 1.13, two stand-in vLLM engines, 224 requests at 16 in flight, w2 killed with
SIGKILL after 150 answers), its verdicts deleted and judged again tick by tick, against the
truth the engines' own logs gave (``tests.observed.rejudge``)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from tests.observed.acceptance import Tally
from tests.observed.rejudge import rejudge

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"


def test_a_failed_attempts_blocks_are_not_read_as_another_requests(tmp_path: Path) -> None:
    """Eight requests failed over from w2 when it died. Before it died, its engine stored
    blocks that only a failed attempt's prompt can have computed; read as the prefill of
    acc-145 (one length with it, on w2; its engine found 112 tokens cached), they made it a
    false hit. A failed attempt's run now competes for them: every definite verdict right."""
    db = tmp_path / "logs+kv.db"
    with gzip.open(CAPTURES / "smg_1.13_verdicts_store.db.gz") as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    truth = json.loads((CAPTURES / "smg_1.13_verdicts_truth.json").read_text())
    got = rejudge(db)
    tally = Tally()
    for rid, category in truth.items():
        tally.add(rid, got.get(rid), category)
    assert tally.wrong == 0, tally.wrong_examples
    assert tally.unknown == 0 and tally.total == 224
    assert got["acc-145"] in ("hit", "hit_or_false_hit")
    assert tally.definite >= 140  # the recorded run's 148 (stored live: 131)
