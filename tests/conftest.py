"""Fixtures every test directory may use: the store backends (``backend``, ``store_db``) —
SQLite in a temporary file, and a real PostgreSQL server started once per session on
127.0.0.1 with a fresh database per test (skipped when PostgreSQL is not installed)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.servers import Postgres, postgres_bin, postgres_server

BACKENDS = ("sqlite", "postgresql")
_names = itertools.count()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    if postgres_bin() is None:
        pytest.skip("PostgreSQL not installed (scripts/test installs postgresql-15 as root)")
    with postgres_server() as pg:
        yield pg


def new_database(pg: Postgres) -> str:
    """A fresh, empty database on ``pg``: its URL."""
    import psycopg

    name = f"t{next(_names)}"
    with psycopg.connect(pg.url(), autocommit=True) as con:
        con.execute(f"CREATE DATABASE {name}")
    return pg.url(name)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_db(backend: str, tmp_path, request: pytest.FixtureRequest) -> str:
    """Where a new store goes: a SQLite path, or a PostgreSQL URL of an empty database."""
    if backend == "sqlite":
        return str(tmp_path / "s.db")
    return new_database(request.getfixturevalue("postgres"))
