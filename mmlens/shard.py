"""Which workers one of N collector processes owns (``mmlens collect --shard I/N``).

A worker belongs to the shard given by a stable hash of its identity (the name the router
knows it by, else its configured name), so N collectors reading the same configuration, on
N machines, split the workers without talking to each other: each worker's KV events and
metrics are collected exactly once. Shard 0 also owns what is not per worker: the routers'
metrics, state and logs, the PromQL queries and the store's retention.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from mmlens.config import WorkerTarget

COLLECTOR = "shard"  # the health rows each shard writes, one per shard


class ShardError(ValueError):
    pass


def shard_of(identity: str, count: int) -> int:
    """The shard of ``identity`` among ``count``: blake2b, not ``hash()``, whose value
    changes from one process to the next."""
    digest = hashlib.blake2b(identity.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def worker_identity(worker: WorkerTarget) -> str:
    return worker.router_url or worker.name


@dataclass(frozen=True, slots=True)
class Shard:
    index: int
    count: int

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def leads(self) -> bool:
        """Shard 0 collects what is not per worker (routers, PromQL, retention)."""
        return self.index == 0

    def owns(self, worker: WorkerTarget) -> bool:
        return shard_of(worker_identity(worker), self.count) == self.index


def parse_shard(text: str) -> Shard:
    """``I/N`` with 0 ≤ I < N."""
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise ShardError(f"--shard {text!r}: expected I/N, e.g. 0/4") from None
    if not sep or n < 1 or not 0 <= i < n:
        raise ShardError(f"--shard {text!r}: expected I/N with 0 <= I < N, e.g. 0/4")
    return Shard(i, n)


def parse_label(label: str) -> Shard | None:
    """A shard health row's target back to its shard (None when it is not ``I/N``)."""
    try:
        return parse_shard(label)
    except ShardError:
        return None
