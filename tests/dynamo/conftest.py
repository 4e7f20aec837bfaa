"""Dynamo tests start the real Dynamo 1.6.1 frontend; they skip when the extra is absent."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "dynamo: needs the Dynamo extra (requirements-dynamo.txt); starts the real "
                   "Dynamo frontend on 127.0.0.1")
