"""The demo's simulated Dynamo engine, also logging what the frontend sent it (for probes).

One JSON line per request, before the engine runs: the rendered token ids, the frontend's
formatted prompt and mm_hashes (`extra_args`), and the length of its routing view.

Run: python -m mmlens.demo.probe_engine (same arguments as mmlens.demo.dynamo_engine)
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncGenerator
from typing import Any

from mmlens.demo import dynamo_engine

MARK = '{"event": "probe_request"'


class ProbedEngine(dynamo_engine.SimulatedVllmEngine):
    async def generate(self, request: Any, context: Any) -> AsyncGenerator[Any, None]:
        extra = request.get("extra_args") or {}
        routing = request.get("mm_routing_info") or {}
        self._emit({
            "event": "probe_request", "token_ids": list(request.get("token_ids") or []),
            "formatted_prompt": extra.get("formatted_prompt"),
            "mm_hashes": list(extra.get("mm_hashes") or []),
            "routing_len": len(routing.get("routing_token_ids") or []),
            "expanded_prompt_len": routing.get("expanded_prompt_len"),
        })
        async for chunk in super().generate(request, context):
            yield chunk


def main(argv: list[str] | None = None) -> int:
    dynamo_engine.run(ProbedEngine, list(sys.argv[1:] if argv is None else argv))
    return 0


def records(log_text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log_text.splitlines() if line.startswith(MARK)]


if __name__ == "__main__":
    sys.exit(main())
