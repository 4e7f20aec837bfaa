"""Exposition parsing on the recorded router outputs and on malformed text."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mmlens.ingest.exposition import ExpositionParser, looks_like_html, parse_exposition
from tests.fixtures_path import capture

CAPTURES = ["smg_http_metrics.txt", "smg_grpc_metrics_kv.txt", "dyn_frontend_metrics_text.txt",
            "dyn_mocker_metrics.txt", "smg_http_engine_metrics.txt"]


def _reference(text: str) -> list[tuple]:
    # Empty label values are dropped (Prometheus semantics; see test_empty_labels_dropped).
    return sorted((s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v)),
                   float(s.value))
                  for fam in text_string_to_metric_families(text) for s in fam.samples)


@pytest.mark.parametrize("name", CAPTURES)
def test_captures_parse_like_prometheus_client(name: str) -> None:
    text = capture(name)
    errors: dict[str, int] = {}
    mine = sorted((s.name, s.labels, s.value) for s in parse_exposition(text, "t", 1.0, errors))
    ref = _reference(text)
    assert errors == {}
    assert len(mine) == len(ref)
    # prometheus_client renames a counter sample without `_total` (Dynamo's
    # `dynamo_component_kv_cache_events_applied`) to `…_total`; the exposition — and a
    # Prometheus server — keep the name as sent, and so do we.
    fixed = sorted((n[:-6] if n.endswith("_total") and (n[:-6], lb, v) in set(mine) else n, lb, v)
                   for n, lb, v in ref)
    assert mine == fixed


def test_counts_from_real_captures() -> None:
    assert len(parse_exposition(capture("smg_http_metrics.txt"), "t", 0)) == 573
    assert len(parse_exposition(capture("smg_grpc_metrics_kv.txt"), "t", 0)) == 380
    dyn = parse_exposition(capture("dyn_frontend_metrics_text.txt"), "t", 0)
    assert len(dyn) == 764
    assert any(s.name == "dynamo_component_kv_cache_events_applied" for s in dyn)


def test_malformed_lines_are_counted_and_skipped() -> None:
    text = ("# TYPE ok counter\nok_total 3\n"
            "broken{label=\"x\" 4\n"           # unterminated label set
            "no_value\n"
            "bad_value{a=\"b\"} twelve\n"
            "too many fields here\n"
            "{orphan=\"1\"} 2\n"
            "ok2 4 1700000000\n")
    errors: dict[str, int] = {}
    samples = parse_exposition(text, "t", 0, errors)
    assert [(s.name, s.value) for s in samples] == [("ok_total", 3.0), ("ok2", 4.0)]
    assert errors == {"malformed_exposition": 5}


def test_special_values_and_cache_reuse() -> None:
    p = ExpositionParser()
    a = p.parse('x{a="1"} NaN\ny +Inf\n', "t", 0)
    b = p.parse('x{a="1"} 2\ny -Inf\n', "t", 1)
    assert a[0].value != a[0].value and a[1].value == float("inf")
    assert (b[0].labels, b[0].value, b[1].value) == ((("a", "1"),), 2.0, float("-inf"))


@pytest.mark.parametrize(("text", "ctype", "html"), [
    ("<!DOCTYPE html><html>", "", True),
    ("  <html><body>login</body></html>", "", True),
    ("x 1\n", "text/html; charset=utf-8", True),
    ("# HELP x\nx 1\n", "text/plain; version=0.0.4", False),
])
def test_html_detection(text: str, ctype: str, html: bool) -> None:
    assert looks_like_html(text, ctype) is html


def test_empty_labels_dropped_like_prometheus() -> None:
    (s,) = parse_exposition('smg_http_responses_total{path="/v1",error_code=""} 7\n', "t", 0)
    assert s.labels == (("path", "/v1"),)


def test_negative_counters_and_overflowing_literals_are_counted() -> None:
    text = ("a_total -3\nb_count -1\nc_bucket{le=\"1\"} -2\ng -5\n"
            "h_sum -1.5\ni 1e999\nj +Inf\nk -Inf\n")
    errors: dict[str, int] = {}
    kept = {s.name: s.value for s in parse_exposition(text, "t", 0, errors)}
    assert kept == {"g": -5.0, "h_sum": -1.5, "j": float("inf"), "k": float("-inf")}
    assert errors == {"bad_number": 4}
