"""deploy/prometheus: promtool checks the rules and the scrape config and runs the rules'
unit tests (alerts_test.yaml: per alert, a case that fires and one that does not); every
metric an alert reads is one forklift exports, and the label values they match are the
code's."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from forklift.metrics import OUTCOMES
from forklift.supervisor.states import KillReason
from tests.deploy.support import DEPLOY, promql_metrics
from tests.tools import tool

PROMETHEUS = DEPLOY / "prometheus"
# Metrics an alert was written against before forklift exported them (none now:
# forklift_queue_paused came with `forklift queues pause`); once exported,
# test_pending_metrics_are_not_exported_yet says so.
PENDING: set[str] = set()
PROMETHEUS_OWN = {"up"}  # made by Prometheus per scrape target


def _promtool(*args: str, cwd: Path = PROMETHEUS) -> str:
    promtool = tool("promtool", install="apt-get install prometheus; scripts/setup does")
    result = subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((PROMETHEUS / "alerts.yaml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _rule(alert: str) -> dict[str, Any]:
    [rule] = [r for r in _rules() if r["alert"] == alert]
    return rule


def test_promtool_checks_the_rules() -> None:
    assert f"SUCCESS: {len(_rules())} rules found" in _promtool("check", "rules", "alerts.yaml")


def test_promtool_unit_tests_pass() -> None:
    assert "SUCCESS" in _promtool("test", "rules", "alerts_test.yaml")


def test_every_alert_has_a_case_that_fires_and_one_that_does_not() -> None:
    cases = yaml.safe_load((PROMETHEUS / "alerts_test.yaml").read_text())["tests"]
    checks = [check for case in cases for check in case["alert_rule_test"]]
    alerts = {rule["alert"] for rule in _rules()}
    firing = {c["alertname"] for c in checks if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in checks if not c.get("exp_alerts")}
    assert (alerts - firing, alerts - quiet) == (set(), set())


def test_promtool_checks_the_scrape_config(tmp_path: Path) -> None:
    """Debian's promtool is built without Kubernetes service discovery: the copy checked
    swaps kubernetes_sd_configs for a static target and keeps everything else."""
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    for job in config["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        job["static_configs"] = [{"targets": ["127.0.0.1:9367"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    shutil.copy(PROMETHEUS / "alerts.yaml", tmp_path)
    assert "SUCCESS" in _promtool("check", "config", "prometheus.yml", cwd=tmp_path)


def test_the_scrape_job_finds_the_deployments_pods_and_is_the_one_alerts_select() -> None:
    [job] = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["scrape_configs"]
    assert f'up{{job="{job["job_name"]}"}}' in _rule("ForkliftDown")["expr"]
    deployment = yaml.safe_load((DEPLOY / "kubernetes" / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["metadata"]
    meta = {f"label_{k}": v for k, v in pod["labels"].items()}
    meta |= {f"annotation_{k}": v for k, v in pod["annotations"].items()}
    meta = {re.sub(r"[^a-zA-Z0-9_]", "_", k): v for k, v in meta.items()}
    for relabel in job["relabel_configs"]:
        for source in relabel["source_labels"]:
            name = source.removeprefix("__meta_kubernetes_pod_")
            if name.startswith(("label_", "annotation_")):
                assert name in meta, f"the pods have no {source}"
                if relabel.get("action") == "keep":
                    assert re.fullmatch(relabel["regex"], meta[name])


def test_alerts_read_only_metrics_forklift_exports(exported: set[str]) -> None:
    unknown = {
        rule["alert"]: sorted(promql_metrics(rule["expr"]) - exported - PROMETHEUS_OWN - PENDING)
        for rule in _rules()
    }
    assert {alert: names for alert, names in unknown.items() if names} == {}


def test_pending_metrics_are_not_exported_yet(exported: set[str]) -> None:
    assert PENDING & exported == set(), "now exported: remove it from PENDING"


def test_alerts_match_the_codes_outcomes_and_restart_reasons() -> None:
    matched = re.findall(r'outcome=~?"([^"]+)"', _rule("ForkliftFailureRate")["expr"])
    assert {o for m in matched for o in m.split("|")} <= set(OUTCOMES)
    crashing = re.search(r'reason=~"([^"]+)"', _rule("ForkliftWorkersCrashing")["expr"])
    assert crashing is not None
    # A kill for an operator's cancel (the handler outran --cancel-grace) is no crash.
    dying = {r.value for r in KillReason if r is not KillReason.CANCEL}
    assert set(crashing[1].split("|")) == dying | {"crash"}


@pytest.mark.parametrize("alert", ["ForkliftBacklogStale", "ForkliftBacklogDeep"])
def test_database_read_gauges_are_not_summed_over_replicas(alert: str) -> None:
    assert _rule(alert)["expr"].startswith("max by (queue)")
