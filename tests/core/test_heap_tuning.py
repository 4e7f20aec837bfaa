"""The tap's allocator settings: an image request's large blocks, freed, are reused by the
next request instead of being faulted in from the kernel again (glibc only)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# What one request does with its image: a body, its base64 text, the decoded bytes, freed.
REQUESTS = """
import resource, sys
from mmlens.cli.heap_tuning import keep_heap
kept = sys.argv[1] == "keep" and keep_heap()
def request(i):
    body = bytes([i % 251]) * (514 << 10)
    text = body.decode("latin-1")[1:]
    data = text.encode("latin-1")[: 385 << 10]
    return len(body) + len(text) + len(data)
request(0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(50):
    request(i)
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", REQUESTS, mode], capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_image_blocks_are_reused_not_faulted_in_again() -> None:
    kept, with_heap = faults("keep")
    if kept != "True":
        pytest.skip("not glibc")
    _, default = faults("default")
    assert default > 50 * 100  # each request faults its ~1.4 MB in again (~350 pages)
    assert with_heap < 50  # a few, once
