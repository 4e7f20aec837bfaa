"""Typed reads of ``mmlens.toml`` tables and demo ready files: every wrong value is a
``ConfigError`` naming its key (``worker[1].dp_size: expected an integer 1..1024, got 'x'``),
endpoints are checked for scheme, host and port range, and files are confined to the config's
directory or directories the config allows by name."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mmlens.errors import ConfigError

MAX_TEXT = 4096
HTTP = ("http", "https")
ZMQ = ("tcp", "ipc", "inproc")
GRPC = ("grpc", "grpcs")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def table(doc: Mapping[str, Any], key: str, where: str = "") -> Mapping[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}{key}: expected a table, got {_shown(value)}")
    return value


def tables(doc: Mapping[str, Any], key: str, limit: int = 10_000) -> list[Mapping[str, Any]]:
    """An array of tables (``[[worker]]``)."""
    value = doc.get(key, [])
    if not isinstance(value, list) or len(value) > limit:
        raise ConfigError(f"{key}: expected a list of at most {limit} tables")
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise ConfigError(f"{key}[{i}]: expected a table, got {_shown(item)}")
    return value


def text(t: Mapping[str, Any], key: str, where: str, required: bool = False) -> str | None:
    value = t.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{where}: missing {key}")
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT or "\x00" in value:
        raise ConfigError(f"{where}.{key}: expected a string, got {_shown(value)}")
    if not value.isascii():
        try:  # a JSON escape (a ready file's) can make a lone surrogate: no path, no URL
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"{where}.{key}: not UTF-8 text: {_shown(value)}") from None
    return value


def number(t: Mapping[str, Any], key: str, where: str, default: float, lo: float,
           hi: float) -> float:
    value = t.get(key, default)
    try:  # an int past a float's range: OverflowError from isfinite and float alike
        ok = (not isinstance(value, bool) and isinstance(value, int | float)
              and math.isfinite(value) and lo <= value <= hi)
    except OverflowError:
        ok = False
    if not ok:
        raise ConfigError(f"{where}{key}: expected a number from {lo:g} to {hi:g}, "
                          f"got {_shown(value)}")
    return float(value)


def integer(t: Mapping[str, Any], key: str, where: str, default: int | None, lo: int,
            hi: int) -> int | None:
    value = t.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{where}{key}: expected an integer {lo}..{hi}, got {_shown(value)}")
    return value


def flag(t: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = t.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}{key}: expected true or false, got {_shown(value)}")
    return value


def choice(t: Mapping[str, Any], key: str, where: str, default: str,
           options: Iterable[str]) -> str:
    value = t.get(key, default)
    options = tuple(options)
    if value not in options:
        raise ConfigError(f"{where}{key}: expected {' | '.join(options)}, got {_shown(value)}")
    return str(value)


def endpoint(value: str | None, where: str, schemes: tuple[str, ...],
             ports_after: int = 0) -> str | None:
    """A URL or socket address with one of ``schemes``, a host and a port in 1..65535
    (``ports_after`` more ports must fit above it: DP ranks listen on port + rank);
    ``ipc://path`` and ``inproc://name`` need only their name."""
    if value is None:
        return None
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:  # a port beyond 65535 or not a number
        raise ConfigError(f"{where}: {_shown(value)} is not a valid address ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise ConfigError(f"{where}: expected a {'/'.join(schemes)} address, "
                          f"got {_shown(value)}")
    if scheme in ("ipc", "inproc"):
        if len(value) <= len(scheme) + 3:
            raise ConfigError(f"{where}: {_shown(value)} names no socket")
        return value
    if not parts.hostname:
        raise ConfigError(f"{where}: {_shown(value)} has no host")
    if scheme not in (*HTTP, "nats", "tls") and port is None:
        raise ConfigError(f"{where}: {_shown(value)} has no port")
    if port is not None and not 1 <= port <= 65535 - ports_after:
        raise ConfigError(f"{where}: port {port} of {_shown(value)} is out of range "
                          f"1..{65535 - ports_after}")
    return value


def confined(value: str | None, where: str, base: Path, allowed: Iterable[Path]) -> str | None:
    """A file path (relative to ``base``) that resolves inside ``base`` or an allowed
    directory; symlinks are followed first, so a link cannot lead out."""
    if value is None:
        return None
    path = (base / value).resolve()
    roots = [base.resolve(), *(Path(a).resolve() for a in allowed)]
    if not any(path == r or r in path.parents for r in roots):
        raise ConfigError(
            f"{where}: {_shown(value)} is outside {_shown(str(roots[0]))}; list its "
            "directory in log_dirs to read it")
    return str(path)


def directories(doc: Mapping[str, Any], key: str, base: Path) -> list[Path]:
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(
            isinstance(v, str) and "\x00" not in v and len(v) <= MAX_TEXT for v in value):
        raise ConfigError(f"{key}: expected a list of directory paths, got {_shown(value)}")
    return [(base / v).resolve() for v in value]
