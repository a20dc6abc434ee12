"""deploy/grafana/forklift.json: it loads as a dashboard, and every query (panels and
variables) reads only metrics forklift exports, covering what an operator watches."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from tests.deploy.support import DEPLOY, promql_metrics

DASHBOARD = DEPLOY / "grafana" / "forklift.json"
# What the dashboard must show: throughput by outcome, latency, queue depth and oldest
# age, workers busy/idle, restarts by reason, cron last success.
WATCHED = {
    "forklift_jobs_total",
    "forklift_job_duration_seconds_bucket",
    "forklift_queue_depth",
    "forklift_oldest_ready_age_seconds",
    "forklift_workers",
    "forklift_worker_restarts_total",
    "forklift_cron_last_success_timestamp_seconds",
}


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row holds its panels


def _queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    for panel in _panels(_dashboard()["panels"]):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            values = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
            assert values is not None, f"${variable['name']}: {query}"
            yield f"${variable['name']}", values[1]


def test_the_dashboard_loads_with_unique_panels_on_the_grid() -> None:
    dashboard = _dashboard()
    assert (dashboard["uid"], dashboard["title"]) == ("forklift", "forklift")
    panels = list(_panels(dashboard["panels"]))
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}"


def test_every_query_reads_metrics_forklift_exports(exported: set[str]) -> None:
    unknown = {}
    for where, expr in _queries():
        names = promql_metrics(expr)
        assert names, f"{where}: {expr} reads no metric"
        if names - exported:
            unknown[where] = sorted(names - exported)
    assert unknown == {}


def test_the_dashboard_shows_what_an_operator_watches() -> None:
    used = {name for _, expr in _queries() for name in promql_metrics(expr)}
    assert WATCHED - used == set()
