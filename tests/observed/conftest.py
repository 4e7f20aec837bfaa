from __future__ import annotations

import pytest
from mmlens.collectors.otlp_receiver import OtlpReceiver

from mmlens.records import SpanRecord


@pytest.fixture
def receiver():
    """An OTLP receiver on free ports (1 MiB body limit) and the spans it handed on."""
    got: list[SpanRecord] = []
    rx = OtlpReceiver(got.extend, grpc_port=0, http_port=0, max_body=1 << 20).start()
    try:
        yield rx, got
    finally:
        rx.stop()
