"""Grafana dashboards over the exported metrics, built with Grafana's foundation SDK: the
headline rows of mmlens' Overview and Cache pages, each panel linking to the mmlens pages
that show the requests behind it (``$mmlens_url``, the dashboard's own URL by default), and
the request panels showing their series' exemplars: request ids that the provisioned
Prometheus data source links to ``/inspector?request=<id>``.

``python -m mmlens.export.grafana --out deploy/grafana/dashboards`` writes the JSON files the
provisioning in ``deploy/grafana`` loads (tests check they are current).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardLinkType, DataSourceRef

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
MMLENS_URL = "http://127.0.0.1:8501"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    exemplars: bool = False  # the series' request ids (the data source links them)


@dataclass(frozen=True)
class PanelSpec:
    title: str
    kind: str  # stat | timeseries
    queries: tuple[Query, ...]
    unit: str = "short"
    description: str = ""
    link: tuple[str, str] = ("Requests in mmlens' Routing page", "/routing")
    width: int = 6


def _rate_share(part: str, whole: str, by: str = "router") -> str:
    return (f"sum by ({by}) (rate({part}[$__rate_interval])) / "
            f"sum by ({by}) (rate({whole}[$__rate_interval]))")


INSPECT = ("Requests in mmlens' inspector", "/inspector")
CACHE = ("mmlens' Cache page", "/cache")
OVERVIEW = ("mmlens' Overview", "/overview")

OVERVIEW_PANELS: tuple[tuple[str, tuple[PanelSpec, ...]], ...] = (
    ("Requests and verdicts", (
        PanelSpec("Requests by verdict", "timeseries", (Query(
            "sum by (verdict) (increase(mmlens_requests_total[$__rate_interval]))",
            "{{verdict}}", exemplars=True),), description="Each request's stored verdict, as "
            "mmlens snapshot gives it; the exemplar dots are requests, each opening in "
            "mmlens' Inspector", link=INSPECT, width=12),
        PanelSpec("False-hit share", "stat", (Query(_rate_share(
            'mmlens_requests_total{verdict="false_hit"}', "mmlens_requests_total"),
            "{{router}}"),), unit="percentunit",
            description="Requests the router predicted cached that the engine did not find"),
        PanelSpec("Count-drift tokens", "stat", (Query(
            "sum by (worker) (increase(mmlens_count_drift_tokens_total[$__range]))",
            "{{worker}}"),), description="Tokens by which engines expanded images to "
            "another length than the router", link=INSPECT),
    )),
    ("Available vs achieved", (
        PanelSpec("Achieved vs available hit rate", "timeseries", (
            Query(_rate_share("mmlens_realized_cached_tokens_total",
                              "mmlens_evaluated_prompt_tokens_total"), "achieved {{router}}"),
            Query(_rate_share("mmlens_available_cached_tokens_total",
                              "mmlens_evaluated_prompt_tokens_total"),
                  "available {{router}}")), unit="percentunit", link=CACHE, width=12),
        PanelSpec("Avoidable prefill tokens per minute by cause", "timeseries", (Query(
            "sum by (cause) (rate(mmlens_avoidable_prefill_tokens_by_cause_total"
            "[$__rate_interval])) * 60", "{{cause}}"),), link=CACHE),
        PanelSpec("Image routing fidelity", "stat", (Query(
            "sum by (fidelity) (increase(mmlens_image_requests_total[$__range])) / ignoring "
            "(fidelity) group_left sum(increase(mmlens_image_requests_total[$__range]))",
            "{{fidelity}}"),), unit="percentunit",
            description="Share of image requests by how the router keyed their images"),
    )),
    ("Collectors", (
        PanelSpec("Since the collector last wrote", "stat", (Query(
            "time() - mmlens_collector_last_write_timestamp_seconds", "{{instance}}"),),
            unit="s", link=OVERVIEW),
        PanelSpec("KV-event lag", "timeseries", (Query(
            "max by (target) (mmlens_collector_lag_seconds)", "{{target}}"),), unit="s",
            link=OVERVIEW),
        PanelSpec("Lost and duplicate KV events", "timeseries", (
            Query("sum by (target) (increase(mmlens_kv_event_unrecovered_gaps_total"
                  "[$__rate_interval]))", "lost gaps {{target}}"),
            Query("sum by (target) (increase(mmlens_kv_event_duplicate_events_total"
                  "[$__rate_interval]))", "duplicates {{target}}")), link=OVERVIEW),
        PanelSpec("Collector errors by kind", "timeseries", (Query(
            "sum by (collector, kind) (increase(mmlens_collector_errors_total"
            "[$__rate_interval]))", "{{collector}} {{kind}}"),), link=OVERVIEW),
    )),
)

CACHE_PANELS: tuple[tuple[str, tuple[PanelSpec, ...]], ...] = (
    ("Per worker", (
        PanelSpec("Achieved hit rate per worker", "timeseries", (Query(_rate_share(
            "mmlens_realized_cached_tokens_total", "mmlens_evaluated_prompt_tokens_total",
            "worker"), "{{worker}}"),), unit="percentunit", link=CACHE, width=12),
        PanelSpec("Avoidable prefill tokens per worker", "timeseries", (Query(
            "sum by (worker, cause) (increase(mmlens_avoidable_prefill_tokens_by_cause_total"
            "[$__rate_interval]))", "{{worker}} {{cause}}"),), link=CACHE, width=12),
        PanelSpec("False-hit tokens per worker", "timeseries", (Query(
            "sum by (worker) (increase(mmlens_false_hit_tokens_total[$__rate_interval]))",
            "{{worker}}"),), link=INSPECT, width=12),
        PanelSpec("False-hit requests per worker", "timeseries", (Query(
            'sum by (worker) (increase(mmlens_requests_total{verdict="false_hit"}'
            "[$__rate_interval]))", "{{worker}}", exemplars=True),), link=INSPECT,
            description="Each exemplar dot is a false-hit request; it opens in mmlens' "
            "Inspector", width=12),
        PanelSpec("Predicted vs realized blocks", "stat", (
            Query("sum(increase(mmlens_predicted_cached_blocks_total[$__range])) / "
                  "sum(increase(mmlens_predicted_request_blocks_total[$__range]))",
                  "predicted"),
            Query("sum(increase(mmlens_predicted_realized_blocks_total[$__range])) / "
                  "sum(increase(mmlens_predicted_request_blocks_total[$__range]))",
                  "realized")), unit="percentunit", link=CACHE, width=12),
    )),
    ("Router view vs engine holdings", (
        PanelSpec("Router-only blocks", "timeseries", (Query(
            "mmlens_kv_router_only_blocks", "{{worker}} ({{source}})"),), link=CACHE,
            width=12),
        PanelSpec("Engine-only blocks", "timeseries", (Query(
            "mmlens_kv_engine_only_blocks", "{{worker}} ({{source}})"),), link=CACHE,
            width=12),
    )),
)

DASHBOARDS = {"mmlens-overview": ("mmlens overview", OVERVIEW_PANELS),
              "mmlens-cache": ("mmlens cache", CACHE_PANELS)}


def _panel(spec: PanelSpec, panel_id: int, height: int = 8) -> Any:
    kind = stat if spec.kind == "stat" else timeseries
    p = kind.Panel().id(panel_id).title(spec.title).datasource(DATASOURCE).unit(spec.unit) \
        .height(height).span(spec.width)
    if spec.description:
        p = p.description(spec.description)
    for i, q in enumerate(spec.queries):
        target = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i)) \
            .exemplar(q.exemplars)
        p = p.with_target(target.legend_format(q.legend) if q.legend else target)
    name, path = spec.link
    return p.links([dash.DashboardLink(name).type(DashboardLinkType.LINK)
                    .url("${mmlens_url}" + path).target_blank(True)])


def build(uid: str) -> dict[str, Any]:
    title, rows = DASHBOARDS[uid]
    d = dash.Dashboard(title).uid(uid).tags(["mmlens"]).refresh("30s").time("now-1h", "now") \
        .timezone("utc") \
        .with_variable(dash.DatasourceVariable("datasource").label("Prometheus")
                       .type("prometheus")) \
        .with_variable(dash.TextBoxVariable("mmlens_url").label("mmlens URL")
                       .default_value(MMLENS_URL)) \
        .link(dash.DashboardLink("mmlens").type(DashboardLinkType.LINK).url("${mmlens_url}")
              .target_blank(True))
    ids = iter(range(1, 1000))
    for row, panels in rows:
        d = d.with_row(dash.Row(row).id(next(ids)))
        for spec in panels:
            d = d.with_panel(_panel(spec, next(ids)))
    return json.loads(json.dumps(d.build(), cls=JSONEncoder))


def queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel of a dashboard's JSON."""
    return [(p["title"], t["expr"]) for p in doc["panels"] if p.get("type") != "row"
            for t in p.get("targets", [])]


def write(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for uid in DASHBOARDS:
        path = out / f"{uid}.json"
        path.write_text(json.dumps(build(uid), indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mmlens.export.grafana", description=__doc__)
    ap.add_argument("--out", default="deploy/grafana/dashboards")
    args = ap.parse_args(argv)
    for path in write(Path(args.out)):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
