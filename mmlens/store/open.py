"""Open a store from ``--db`` / ``MMLENS_DB``: a PostgreSQL URL (``postgresql://…``) or a SQLite
file path."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from mmlens.store.base import NoStoreYet, SQLStore, StoreError

__all__ = ["NoStoreYet", "StoreError", "is_postgres_url", "label", "open_store", "redact"]


def is_postgres_url(db: str | Path) -> bool:
    return str(db).startswith(("postgresql://", "postgres://"))


def open_store(db: str | Path, readonly: bool = False) -> SQLStore:
    """The store at ``db``, created when missing unless ``readonly``."""
    if is_postgres_url(db):
        from mmlens.store.postgres import PostgresStore  # psycopg only when asked for

        return PostgresStore(str(db), readonly=readonly)
    from mmlens.store.sqlite import Store

    return Store(db, readonly=readonly)


def redact(url: str) -> str:
    """``url`` without its password, for messages and page captions."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def label(db: str | Path) -> str:
    """How a page names the store: the file's name, or the server URL without password."""
    return redact(str(db)) if is_postgres_url(db) else Path(db).name
