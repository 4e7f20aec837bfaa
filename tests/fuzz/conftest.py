"""The store the fuzz tests write what the parsers return into (one per test module)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mmlens.store.sqlite import Store


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    s = Store(":memory:")
    yield s
    s.close()
