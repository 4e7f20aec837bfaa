"""The Grafana dashboards: generated from code with Grafana's foundation SDK, committed as
generated, valid against the SDK's dashboard schema, each panel linked to mmlens, and every
query over metrics the exporter serves (tests/export/test_live_export.py runs each query on
a real Prometheus scraping the demo)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

grafana = pytest.importorskip("mmlens.export.grafana",
                              reason="grafana-foundation-sdk not installed")
from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: E402
from grafana_foundation_sdk.models.dashboard import Dashboard  # noqa: E402
from mmlens.collectors.metrics_export import StoreExport  # noqa: E402

from tests.export.metrics_text import scrape, series  # noqa: E402
from tests.pages.recorded_store import fill  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards"


@pytest.mark.parametrize("uid", sorted(grafana.DASHBOARDS))
def test_committed_json_is_what_the_generator_writes(uid) -> None:
    committed = json.loads((OUT / f"{uid}.json").read_text())
    assert committed == grafana.build(uid), "run python -m mmlens.export.grafana"


@pytest.mark.parametrize("uid", sorted(grafana.DASHBOARDS))
def test_json_round_trips_through_the_sdk_schema(uid) -> None:
    doc = json.loads((OUT / f"{uid}.json").read_text())
    model = Dashboard.from_json(doc)
    assert json.loads(json.dumps(model, cls=JSONEncoder)) == doc  # no field the schema lacks
    assert model.uid == uid and model.title == grafana.DASHBOARDS[uid][0]
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in doc["panels"]}) == len(doc["panels"])
    assert panels and all(p["targets"] and p["datasource"]["uid"] == "${datasource}"
                          for p in panels)
    assert all(link["url"].startswith("${mmlens_url}/") for p in panels for link in p["links"])


def test_every_query_reads_exported_metrics(tmp_path) -> None:
    text = scrape(StoreExport(fill(str(tmp_path / "r.db"), time.time()).path))
    # Every family the exporter declares (some have no series on this store).
    names = {name + ("_total" if kind == "counter" and not name.endswith("_total") else "")
             for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M)}
    assert {name for name, _ in series(text)} <= names
    for uid in grafana.DASHBOARDS:
        for title, expr in grafana.queries(grafana.build(uid)):
            used = set(re.findall(r"\bmmlens_[a-z_]+", expr))
            assert used and used <= names, (uid, title, used - names)


def test_exemplars_link_to_the_inspector() -> None:
    """The provisioned data source turns the exporter's exemplar label into an Inspector
    link, and the request panels ask for exemplars."""
    import yaml

    from mmlens.export.families import exemplar
    from mmlens.records import RequestTrace

    src = yaml.safe_load((OUT.parent / "provisioning" / "datasources" / "mmlens.yml")
                         .read_text())["datasources"][0]
    (dest,) = src["jsonData"]["exemplarTraceIdDestinations"]
    ex = exemplar((RequestTrace("req-1", "r", "smg", "m", 0.0, False), 1))
    assert ex is not None and set(ex.labels) == {dest["name"]}
    assert dest["url"].endswith("/inspector?request=${__value.raw}")
    asked = [p["title"] for uid in grafana.DASHBOARDS for p in grafana.build(uid)["panels"]
             if any(t.get("exemplar") for t in p.get("targets", []))]
    assert "Requests by verdict" in asked and "False-hit requests per worker" in asked
