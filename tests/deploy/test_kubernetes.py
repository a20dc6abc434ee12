"""deploy/kubernetes: every manifest validates against the Kubernetes OpenAPI schemas
(strict: an unknown field fails), and its grace period, probes, port, memory and user
agree with what forklift's CLI, supervisor and image actually do."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from forklift.supervisor.config import SupervisorConfig
from tests.deploy.support import DEPLOY, metrics_port, parse_run, routes, run_config

KUBE = DEPLOY / "kubernetes"
# kustomization.yaml is kustomize's own configuration, not a Kubernetes API object: there
# is no OpenAPI schema for it (test_the_kustomization_ties_every_manifest_together).
MANIFESTS = sorted(p for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")
# The optional dashboard, applied apart (kubectl apply -k deploy/kubernetes/dashboard).
DASHBOARD = KUBE / "dashboard"
DASHBOARD_MANIFESTS = sorted(p for p in DASHBOARD.glob("*.yaml") if p.name != "kustomization.yaml")
# The oldest Kubernetes these manifests are for, and the newest the schemas know.
VERSIONS = ("1.29", kubernetes_validate.latest_version())
SUPERVISOR_MIB = 150  # the supervisor's own memory, beside its workers


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kind(kind: str) -> dict[str, Any]:
    [found] = [doc for path in MANIFESTS for doc in _documents(path) if doc["kind"] == kind]
    return found


def _container(kind: str) -> dict[str, Any]:
    containers: list[dict[str, Any]] = _kind(kind)["spec"]["template"]["spec"]["containers"]
    [container] = containers
    return container


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _workers() -> tuple[dict[str, Any], SupervisorConfig]:
    """The workers' container and the SupervisorConfig its args and env make."""
    container = _container("Deployment")
    return container, run_config(container["args"], _env(container))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS + DASHBOARD_MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_validates_strictly(path: Path, version: str) -> None:
    for doc in _documents(path):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError as exc:
            pytest.fail(f"{path.name}: {exc.message} (a CRD: vendor its schema or use none)")
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{path.name} {doc['kind']}: {where}: {exc.message}")


def test_the_kustomization_ties_every_manifest_together() -> None:
    [kustomization] = _documents(KUBE / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == [p.name for p in MANIFESTS]
    images = {i["name"] for i in kustomization["images"]}
    used = {_container(k)["image"].rsplit(":", 1)[0] for k in ("Deployment", "Job")}
    assert used == images


def test_the_grace_period_exceeds_the_shutdown_budget() -> None:
    container, config = _workers()
    spec = _kind("Deployment")["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] > config.shutdown_budget
    # A preStop hook would run inside that same period, before SIGTERM.
    assert "lifecycle" not in container


def test_probes_and_the_metrics_port_are_the_supervisors() -> None:
    container, _ = _workers()
    host, port = metrics_port(container["args"], _env(container))
    assert host not in ("127.0.0.1", "localhost", "::1"), "the kubelet probes from outside"
    assert port == metrics_port(["run", "any:app"])[1], "the CLI's default port"
    [declared] = container["ports"]
    assert (declared["name"], declared["containerPort"]) == ("metrics", port)
    paths = {
        kind: container[kind]["httpGet"]["path"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert paths == {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",  # the loop ticks; a database outage is not a restart
        "readinessProbe": "/readyz",
    }
    assert set(paths.values()) <= routes()
    assert {container[kind]["httpGet"]["port"] for kind in paths} == {"metrics"}
    annotations = _kind("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] in routes()


def _mib(quantity: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return float(number) * (1024 if unit == "Gi" else 1)


def test_forklift_kills_a_leaking_worker_before_the_kernel_does() -> None:
    container, config = _workers()
    assert config.max_memory_per_child is not None
    hard = config.workers * config.max_memory_per_child * config.hard_memory_factor
    assert hard + SUPERVISOR_MIB <= _mib(container["resources"]["limits"]["memory"])
    # One worker per requested core (os.cpu_count() in a container is the node's).
    assert config.workers == int(container["resources"]["requests"]["cpu"])


def test_migrations_run_once_per_release_not_in_every_replica() -> None:
    job = _container("Job")
    assert parse_run(job["args"], _env(job)).command == "migrate"
    pod = _kind("Deployment")["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert job["image"] == _container("Deployment")["image"]
    assert job["envFrom"] == _container("Deployment")["envFrom"]


def _dockerfile_uid() -> int:
    users = re.findall(r"^USER\s+(\d+)", (DEPLOY / "Dockerfile").read_text(), re.M)
    return int(users[-1])


@pytest.mark.parametrize("kind", ["Deployment", "Job"])
def test_pods_run_as_the_images_user_on_a_read_only_root(kind: str) -> None:
    pod = _kind(kind)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == _dockerfile_uid()
    assert pod["automountServiceAccountToken"] is False
    context = _container(kind)["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]


def test_the_disruption_budget_covers_the_workers_and_the_rollout_keeps_capacity() -> None:
    deployment = _kind("Deployment")["spec"]
    budget = _kind("PodDisruptionBudget")["spec"]
    assert budget["selector"] == deployment["selector"]
    assert budget["maxUnavailable"] < deployment["replicas"]
    assert deployment["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def _dashboard(kind: str) -> dict[str, Any]:
    [found] = [d for path in DASHBOARD_MANIFESTS for d in _documents(path) if d["kind"] == kind]
    return found


def test_the_dashboard_kustomization_ties_its_manifests_and_the_workers_image() -> None:
    [kustomization] = _documents(DASHBOARD / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == [p.name for p in DASHBOARD_MANIFESTS]
    [workers] = _documents(KUBE / "kustomization.yaml")
    assert kustomization["images"] == workers["images"]
    [container] = _dashboard("Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == _container("Deployment")["image"]
    assert container["envFrom"] == _container("Deployment")["envFrom"]


def test_the_dashboard_is_read_only_and_serves_where_its_probes_and_service_look() -> None:
    from forklift.dashboard.config import parse_bind

    deployment, service = _dashboard("Deployment"), _dashboard("Service")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    args = parse_run(container["args"], _env(container))
    assert args.command == "dashboard" and args.allow_actions is False
    host, port = parse_bind(args.bind)
    assert host == "0.0.0.0", "the Service reaches the pod from outside it"
    [declared] = container["ports"]
    assert (declared["name"], declared["containerPort"]) == ("http", port)
    [token] = [e for e in container["env"] if e["name"] == "FORKLIFT_DASHBOARD_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"]["optional"] is True
    paths = {container[k]["httpGet"]["path"] for k in ("livenessProbe", "readinessProbe")}
    assert paths == {"/healthz"} and "healthz" in dashboard_endpoints()
    [exposed] = service["spec"]["ports"]
    assert exposed["targetPort"] == "http"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == _dockerfile_uid()
    assert pod["automountServiceAccountToken"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def dashboard_endpoints() -> set[str]:
    """The endpoints a read-only dashboard serves (no database is touched to list them)."""
    from forklift import _db
    from forklift.admin import Connector
    from forklift.dashboard.config import DashboardConfig
    from forklift.dashboard.reader import Reader
    from forklift.dashboard.web import create_app

    dsn = "postgresql://unused@127.0.0.1:9/unused"
    reader = Reader(dsn, "unused", Connector(dsn, _db.Timeouts()))
    app = create_app(DashboardConfig("0.0.0.0", 8787), reader)
    return {rule.endpoint for rule in app.url_map.iter_rules()}
