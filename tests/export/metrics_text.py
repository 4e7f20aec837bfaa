"""Reading an exposition back: the samples of a scrape as {(name, labels): value}."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(collector: object) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def series(text: str) -> Series:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def total(found: Series, name: str, **match: str) -> float:
    """The sum of ``name``'s series whose labels include ``match``."""
    return sum(v for (n, labels), v in found.items()
               if n == name and match.items() <= dict(labels).items())


def by(found: Series, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (n, labels), v in found.items():
        if n == name:
            key = dict(labels)[label]
            out[key] = out.get(key, 0.0) + v
    return out
