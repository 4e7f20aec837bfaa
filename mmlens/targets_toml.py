"""``mmlens.toml`` text for the Targets view: generated from a demo ready line, validated
before it is saved."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmlens.config import Config, ConfigError, parse_config


def _q(value: Any) -> str:
    return json.dumps(value)  # a JSON string literal is a valid TOML basic string


def router_name_of(worker: dict[str, Any]) -> str:
    """How the router names a worker: SMG by URL, Dynamo by its numeric worker id."""
    return str(worker.get("url") or worker.get("grpc") or worker.get("worker_id")
               or worker.get("http") or worker["name"])


def demo_routers(ready: dict[str, Any]) -> list[dict[str, Any]]:
    """The demo's routers from its ready line: ``routers`` (name, url, metrics, log, mode), or
    the single ``router`` of older ready lines and the Dynamo demo."""
    if ready.get("routers"):
        return list(ready["routers"])
    return [{"name": "demo", "url": ready["router"], "metrics": ready.get("router_metrics"),
             "log": ready.get("router_log"), "mm_processing": ready.get("mm_processing")}]


def config_toml_from_ready(ready: dict[str, Any], interval_s: float = 2.0,
                           log_dirs: Sequence[str] = ()) -> str:
    """``log_dirs``: where the demo's logs are when that is not next to the config."""
    lines = [f"interval_s = {interval_s}", "timeout_s = 2"]
    if log_dirs:
        lines.append(f"log_dirs = [{', '.join(_q(d) for d in log_dirs)}]")
    lines += ["", "[store]", "retention_s = 86400", "max_mb = 512", ""]
    for r in demo_routers(ready):
        lines += ["[[router]]", f"name = {_q(r['name'])}",
                  f"kind = {_q(ready.get('router_kind', 'smg'))}", f"url = {_q(r['url'])}"]
        if r.get("metrics"):
            lines.append(f"metrics_url = {_q(r['metrics'])}")
        if r.get("log"):
            lines.append(f"log_file = {_q(r['log'])}")
        if ready.get("media_origin"):  # the demo's: its workers fetch image URLs from it
            lines.append(f"media_origin = {_q(ready['media_origin'])}")
        lines += ["discover_workers = false", ""]
    for w in ready.get("workers") or []:
        lines += ["[[worker]]", f"name = {_q(w['name'])}", 'engine = "vllm"',
                  f"router_url = {_q(router_name_of(w))}"]
        for key, field in (("metrics", "metrics_url"), ("kv_events", "kv_events"),
                           ("kv_replay", "kv_replay")):
            if w.get(key):
                lines.append(f"{field} = {_q(w[key])}")
        if w.get("kv_topic"):
            lines.append(f"topic = {_q(w['kv_topic'])}")
        lines.append("")
    return "\n".join(lines)


def validate_toml(text: str, base_dir: Path = Path(".")) -> Config:
    """The parsed config, or ConfigError with the reason (syntax, secrets, bad fields);
    ``base_dir`` is where the file will live (log files are confined to it)."""
    try:
        doc = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise ConfigError(f"TOML syntax: {exc}") from None
    return parse_config(doc, base_dir)


_WHERE = re.compile(r"^(?:(router|worker)\[(\d+)\]|(\w+))\.?(\w+)?:")


def error_line(text: str, message: str) -> int | None:
    """The 1-based line of ``text`` a validation message points at (``router[1].url: …``,
    ``store.max_mb: …``, ``interval_s: …``), when it can be found."""
    m = _WHERE.match(message)
    if not m:
        return None
    array, index, table, key = m.groups()
    if table and not key:  # a top-level key
        table, key = None, table
    header = f"[[{array}]]" if array else f"[{table}]" if table else None
    count, inside = -1, header is None
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("["):
            if stripped.replace(" ", "") == header:
                count += 1
                inside = array is None or count == int(index)
            else:
                inside = False
            continue
        if inside and key and re.match(rf"{re.escape(key)}\s*=", stripped):
            return n
    return None
