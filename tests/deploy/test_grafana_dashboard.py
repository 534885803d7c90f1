"""``deploy/grafana/infera.json`` queries only metrics the router really exports.

A server with every optional part on (KV routing, API keys; PD series are always
registered) is scraped; every ``infera_*`` name in the dashboard's queries must be one
of its series. Renaming a metric in the code without the dashboard fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from infera_core.kv.component import KvRouting
from infera_core.kv.settings import KvSettings
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy/grafana/infera.json"
NAME = re.compile(r"\binfera_[a-zA-Z0-9_]*")
SUFFIXES = {
    "counter": ("", "_created"),  # the TYPE line already names the _total sample
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
}


def exported_names(text: str) -> set[str]:
    """Every sample name ``text`` (Prometheus exposition) has or would have once observed."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ", 3)
            if kind == "counter":
                names.update((family, family.removesuffix("_total") + "_created"))
            else:
                names.update(family + s for s in SUFFIXES.get(kind, ("",)))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and templating query."""
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r}", target["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            out.append((f"variable ${var['name']}", query))
    return out


def unknown_metrics(dashboard: dict[str, Any], exported: set[str]) -> list[str]:
    return [
        f"{where}: {name}"
        for where, expr in queries(dashboard)
        for name in NAME.findall(expr)
        if name not in exported
    ]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


async def test_every_metric_the_dashboard_queries_is_exported(
    dashboard: dict[str, Any], tmp_path: Path
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n  - name: team-a\n    key: sk-a\n")
    hooks = make_hooks()
    kv = KvRouting(hooks.catalog(), KvSettings())
    async with serving(settings_for(api_key_file=str(keys)), hooks, kv=kv) as srv, httpx.AsyncClient() as c:
        text = (await c.get(srv.url + "/metrics")).text
    exported = exported_names(text)
    assert "infera_requests_total" in exported and "infera_routing_decision_seconds_bucket" in exported
    assert unknown_metrics(dashboard, exported) == []
    used = {n for _, expr in queries(dashboard) for n in NAME.findall(expr)}
    assert len(used) >= 20  # the dashboard covers traffic, latency, fleet, KV, PD and keys


def test_a_renamed_metric_is_caught(dashboard: dict[str, Any]) -> None:
    exported = {n for _, e in queries(dashboard) for n in NAME.findall(e)} - {"infera_requests_total"}
    assert any("infera_requests_total" in problem for problem in unknown_metrics(dashboard, exported))


def test_dashboard_is_importable_grafana_json(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] and dashboard["schemaVersion"] >= 36
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "model"} <= names
    for panel in dashboard["panels"]:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        for t in panel["targets"]:
            expr = t["expr"]
            assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
