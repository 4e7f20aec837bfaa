"""The store interface every backend implements: the shared writes and reads over a backend's
hooks (``mmlens.store.dialect``). SQLite (``mmlens.store.sqlite``) is the embedded default,
PostgreSQL (``mmlens.store.postgres``) the server store for fleets; ``mmlens.store.open``
picks one from ``--db``."""

from __future__ import annotations

from mmlens.store.availability import AvailabilityTables
from mmlens.store.dialect import PRUNED_TABLES, SCHEMA_VERSION, NoStoreYet, StoreError
from mmlens.store.reads import StoreReads
from mmlens.store.rollups import RollupTables
from mmlens.store.verdicts import VerdictTables
from mmlens.store.versions import StoreVersions
from mmlens.store.writes import StoreWrites

__all__ = ["PRUNED_TABLES", "SCHEMA_VERSION", "NoStoreYet", "SQLStore", "StoreError"]


class SQLStore(StoreWrites, StoreReads, AvailabilityTables, VerdictTables, RollupTables,
               StoreVersions):
    """One store connection: a collector's writer, or (``readonly``) the dashboard's reader."""
