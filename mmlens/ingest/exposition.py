"""Prometheus text exposition → MetricSample records.

prometheus_client's parser is the parser of record, but it is pure Python and costs ~15 µs a
line; a fleet of targets re-sends the same series with new values every scrape. So each
distinct series text (everything before the value) is parsed once by prometheus_client and
remembered; later lines with the same series text only need ``float(value)``.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from mmlens.records import Labels, MetricSample

_SeriesKey = tuple[str, Labels]
_CACHE_LIMIT = 500_000
_NON_NEGATIVE = ("_total", "_count", "_bucket")
_INFINITE = (float("inf"), float("-inf"))


def looks_like_html(text: str, content_type: str = "") -> bool:
    if "html" in content_type.lower():
        return True
    head = text.lstrip()[:64].lower()
    return head.startswith(("<!doctype", "<html", "<head", "<body", "<?xml"))


class ExpositionParser:
    """Parses exposition text; malformed lines are counted in ``errors`` and skipped."""

    def __init__(self) -> None:
        self._series: dict[str, _SeriesKey] = {}

    def parse(self, text: str, target: str, ts: float,
              errors: dict[str, int] | None = None) -> list[MetricSample]:
        out: list[MetricSample] = []
        cache = self._series
        if len(cache) > _CACHE_LIMIT:
            cache.clear()
        bad = bad_numbers = 0
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line[0] == "#":
                continue
            brace = line.rfind("}")
            cut = brace + 1 if brace >= 0 else _first_space(line)
            if cut <= 0:
                bad += 1
                continue
            series_text = line[:cut].rstrip()
            rest = line[cut:].split()
            if not rest or len(rest) > 2:
                bad += 1
                continue
            key = cache.get(series_text)
            if key is None:
                key = _parse_series(series_text, rest[0])
                if key is None:
                    bad += 1
                    continue
                cache[series_text] = key
            try:
                value = float(rest[0])
            except ValueError:
                bad += 1
                continue
            if (value < 0 and key[0].endswith(_NON_NEGATIVE)) or (
                    value in _INFINITE and not rest[0].lstrip("+-").lower().startswith("inf")):
                bad_numbers += 1  # a negative counter, or a literal beyond float range
                continue
            out.append(MetricSample(target, key[0], key[1], value, ts))
        if errors is not None:
            if bad:
                errors["malformed_exposition"] = errors.get("malformed_exposition", 0) + bad
            if bad_numbers:
                errors["bad_number"] = errors.get("bad_number", 0) + bad_numbers
        return out


def _first_space(line: str) -> int:
    for i, ch in enumerate(line):
        if ch in " \t":
            return i
    return -1


def _parse_series(series_text: str, value: str) -> _SeriesKey | None:
    try:
        families = list(text_string_to_metric_families(f"{series_text} {value}\n"))
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    if len(families) != 1 or len(families[0].samples) != 1:
        return None
    sample = families[0].samples[0]
    # An empty label value is the same as no label (Prometheus drops it at ingestion), so
    # direct scrapes and PromQL results name the same series.
    return sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if v != ""))


def parse_exposition(text: str, target: str, ts: float,
                     errors: dict[str, int] | None = None) -> list[MetricSample]:
    """One-shot parse without a shared cache (tests, fixtures)."""
    return ExpositionParser().parse(text, target, ts, errors)
