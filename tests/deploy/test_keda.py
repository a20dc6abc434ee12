"""deploy/kubernetes/keda: the ScaledObjects and the TriggerAuthentication validate
against KEDA's CRD schemas (tests/deploy/schemas, closed to unknown fields); the
postgresql scaler's queries answer a number on a migrated schema, as the read-only role
of role.sql, from one range of an index per queue whatever the backlog; and the scaling
agrees with the workers' Deployment: its name, queues, grace period and disruption
budget."""

from __future__ import annotations

import copy
import functools
import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import psycopg
import pytest
import yaml

from tests.deploy.support import DEPLOY, promql_metrics, run_config

KUBE = DEPLOY / "kubernetes"
KEDA = KUBE / "keda"  # the default: the postgresql scaler
PROMETHEUS = KEDA / "prometheus"  # the alternative: the prometheus scaler
COMPONENTS = (KEDA, PROMETHEUS)
SCHEMAS = Path(__file__).parent / "schemas"
SCHEMA_FILES = {
    "ScaledObject": "keda.sh_scaledobjects.yaml",
    "TriggerAuthentication": "keda.sh_triggerauthentications.yaml",
}
TARGET_QUERIES = {"postgresql": "targetQueryValue", "prometheus": "threshold"}
# What the postgresql scaler's connection needs (KEDA's postgreSQLMetadata).
CONNECTION = {"host", "port", "dbName", "userName", "password", "sslmode"}


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kustomization(directory: Path) -> dict[str, Any]:
    [found] = _documents(directory / "kustomization.yaml")
    return found


def _manifests(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.yaml") if p.name != "kustomization.yaml")


def _objects(directory: Path) -> list[dict[str, Any]]:
    return [doc for path in _manifests(directory) for doc in _documents(path)]


def _one(directory: Path, kind: str) -> dict[str, Any]:
    [found] = [doc for doc in _objects(directory) if doc["kind"] == kind]
    return found


def _base(kind: str) -> dict[str, Any]:
    return _one(KUBE, kind)


def _trigger(directory: Path, name: str) -> dict[str, Any]:
    triggers: list[dict[str, Any]] = _one(directory, "ScaledObject")["spec"]["triggers"]
    [found] = [t for t in triggers if t["name"] == name]
    return found


def _closed(schema: Any) -> Any:
    """The schema with every object that names its properties closed to others: the API
    server drops or (strict field validation, kubectl's default) refuses an unknown
    field, which plain JSON Schema would let through."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: _closed(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        closed["additionalProperties"] = False
    return closed


@functools.cache
def _validator(kind: str) -> Any:
    schema = yaml.safe_load((SCHEMAS / SCHEMA_FILES[kind]).read_text())
    return jsonschema.Draft7Validator(_closed(schema))


def _errors(doc: dict[str, Any]) -> list[str]:
    """What KEDA's CRD schema finds wrong with `doc`, one line per error."""
    found = _validator(doc["kind"]).iter_errors(doc)
    return [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in found]


@pytest.mark.parametrize(
    "path",
    [p for d in COMPONENTS for p in _manifests(d)],
    ids=lambda p: str(p.relative_to(KEDA)),
)
def test_every_object_validates_against_kedas_crd_schema(path: Path) -> None:
    for doc in _documents(path):
        assert doc["apiVersion"] == "keda.sh/v1alpha1"
        assert doc["kind"] in SCHEMA_FILES, f"{path.name}: no vendored schema for {doc['kind']}"
        assert doc["metadata"]["name"]
        assert _errors(doc) == [], f"{path.name} {doc['kind']}"


def test_the_schemas_refuse_a_misspelt_field_and_a_missing_one() -> None:
    scaled = _one(KEDA, "ScaledObject")
    misspelt = copy.deepcopy(scaled)
    misspelt["spec"]["minReplicas"] = misspelt["spec"].pop("minReplicaCount")
    assert _errors(misspelt) == [
        "spec: Additional properties are not allowed ('minReplicas' was unexpected)"
    ]
    untyped = copy.deepcopy(scaled)
    del untyped["spec"]["triggers"][0]["type"]
    assert _errors(untyped) == ["spec.triggers.0: 'type' is a required property"]
    auth = copy.deepcopy(_one(KEDA, "TriggerAuthentication"))
    auth["spec"]["secretTargetRef"][0]["secret"] = auth["spec"]["secretTargetRef"][0].pop("name")
    assert len(_errors(auth)) == 2  # no name, and a field the schema does not know


@pytest.mark.parametrize("directory", COMPONENTS, ids=lambda d: d.name)
def test_each_component_adds_its_objects_and_hands_the_replicas_to_the_hpa(
    directory: Path,
) -> None:
    component = _kustomization(directory)
    assert (component["apiVersion"], component["kind"]) == (
        "kustomize.config.k8s.io/v1alpha1",
        "Component",
    )
    assert sorted(component["resources"]) == [p.name for p in _manifests(directory)]
    [patch] = component["patches"]
    deployment = _base("Deployment")
    assert patch["target"] == {
        "group": "apps",
        "version": "v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    # kustomize fails a remove of a path that is not there: the base must have it.
    assert "replicas" in deployment["spec"]
    assert yaml.safe_load(patch["patch"]) == [{"op": "remove", "path": "/spec/replicas"}]


def test_the_base_applies_on_a_cluster_without_keda() -> None:
    resources = _kustomization(KUBE)["resources"]
    assert not any("keda" in r for r in resources)
    assert {doc["apiVersion"].split("/")[0] for doc in _objects(KUBE)}.isdisjoint({"keda.sh"})


@pytest.mark.parametrize("directory", COMPONENTS, ids=lambda d: d.name)
def test_it_scales_the_workers_deployment(directory: Path) -> None:
    scaled = _one(directory, "ScaledObject")
    deployment = _base("Deployment")
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": deployment["apiVersion"],
        "kind": deployment["kind"],
        "name": deployment["metadata"]["name"],
    }
    assert scaled["metadata"]["labels"] == deployment["metadata"]["labels"]


@pytest.mark.parametrize("directory", COMPONENTS, ids=lambda d: d.name)
def test_scale_down_waits_out_each_drain_and_keeps_replicas_through_a_node_drain(
    directory: Path,
) -> None:
    spec = _one(directory, "ScaledObject")["spec"]
    budget = _base("PodDisruptionBudget")["spec"]["maxUnavailable"]
    grace = _base("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # Never 0 (the schedules and the reaper run in the supervisors); a drain leaves one.
    assert spec["minReplicaCount"] > budget
    assert spec["maxReplicaCount"] > spec["minReplicaCount"]
    down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 60
    assert down["policies"], "no policy: the HPA would remove any number at once"
    for policy in down["policies"]:
        # One replica at a time, the next only after the last one's grace period.
        assert policy["type"] == "Pods" and policy["value"] <= budget
        assert policy["periodSeconds"] >= grace


@pytest.mark.parametrize("directory", COMPONENTS, ids=lambda d: d.name)
def test_values_the_schema_leaves_to_keda_and_the_hpa_are_ones_they_take(
    directory: Path,
) -> None:
    """The CRD types these as plain strings and integers; KEDA and the HPA's own
    validation refuse anything else, only once the object is applied."""
    spec = _one(directory, "ScaledObject")["spec"]
    for rules in spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"].values():
        assert rules["selectPolicy"] in ("Max", "Min", "Disabled")
        for policy in rules["policies"]:
            assert policy["type"] in ("Pods", "Percent") and policy["value"] > 0
            assert 0 < policy["periodSeconds"] <= 1800
    names = [t["name"] for t in spec["triggers"]]
    assert len(set(names)) == len(names)
    for trigger in spec["triggers"]:
        assert trigger["type"] in TARGET_QUERIES
        assert trigger["metricType"] in ("AverageValue", "Value")
        assert float(trigger["metadata"][TARGET_QUERIES[trigger["type"]]]) > 0


def test_both_variants_scale_alike() -> None:
    default, alternative = (_one(d, "ScaledObject") for d in COMPONENTS)
    assert {k: v for k, v in default["spec"].items() if k != "triggers"} == {
        k: v for k, v in alternative["spec"].items() if k != "triggers"
    }
    for name in ("backlog", "oldest_ready_age"):
        one, other = (_trigger(d, name) for d in COMPONENTS)
        assert one["metricType"] == other["metricType"]
        assert (
            one["metadata"][TARGET_QUERIES[one["type"]]]
            == (other["metadata"][TARGET_QUERIES[other["type"]]])
        )


@pytest.mark.parametrize("directory", COMPONENTS, ids=lambda d: d.name)
def test_the_backlog_target_is_per_replica_and_above_what_a_stopping_one_releases(
    directory: Path,
) -> None:
    backlog = _trigger(directory, "backlog")
    assert backlog["metricType"] == "AverageValue"  # the backlog / target = replicas
    target = float(backlog["metadata"][TARGET_QUERIES[backlog["type"]]])
    container = _base("Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    config = run_config(container["args"], env)
    # The jobs in a stopping replica's slots go back to the line: fewer than one
    # replica's worth, they never read as a reason to scale up again.
    assert config.workers * config.worker.concurrency < target
    # The wait scales proportionally (Value: replicas x age / target).
    assert _trigger(directory, "oldest_ready_age")["metricType"] == "Value"


def _query(name: str) -> str:
    query: str = _trigger(KEDA, name)["metadata"]["query"]
    return query


def test_the_backlog_cap_never_hides_a_replica() -> None:
    caps = {int(n) for n in re.findall(r"LIMIT (\d+)", _query("backlog"))}
    spec = _one(KEDA, "ScaledObject")["spec"]
    target = float(_trigger(KEDA, "backlog")["metadata"]["targetQueryValue"])
    assert len(caps) == 1 and caps.pop() >= target * spec["maxReplicaCount"]


def _served(query: str) -> list[str]:
    [listed] = re.findall(r"unnest\('\{([^}]*)\}'::text\[\]\)", query)
    return str(listed).split(",")


def test_the_queries_and_gauges_are_of_the_queues_the_deployment_serves() -> None:
    container = _base("Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    queues = list(run_config(container["args"], env).worker.queues)
    for name in ("backlog", "oldest_ready_age"):
        assert _served(_query(name)) == queues
        promql = _trigger(PROMETHEUS, name)["metadata"]["query"]
        assert re.findall(r'queue="([^"]*)"', promql) == queues


def test_the_prometheus_variant_reads_gauges_forklift_exports(exported: set[str]) -> None:
    for name in ("backlog", "oldest_ready_age"):
        promql = _trigger(PROMETHEUS, name)["metadata"]["query"]
        assert promql_metrics(promql) <= exported
        # Every replica exports the same database-read gauge: one of them, not the sum.
        assert promql.startswith("max(")


def test_the_triggers_connect_through_a_role_of_their_own() -> None:
    auth = _one(KEDA, "TriggerAuthentication")
    for trigger in _one(KEDA, "ScaledObject")["spec"]["triggers"]:
        assert trigger["type"] == "postgresql"
        assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
        assert not CONNECTION & set(trigger["metadata"]), "connection details in the Secret"
    refs = auth["spec"]["secretTargetRef"]
    assert {r["parameter"] for r in refs} == CONNECTION
    assert {r["parameter"] for r in refs} == {r["key"] for r in refs}
    # Not the workers' Secret: KEDA gets a role that can read four columns, no more.
    assert {r["name"] for r in refs} == {"forklift-keda"}
    assert {r["name"] for r in refs}.isdisjoint(_workers_secrets())


def _workers_secrets() -> set[str]:
    container = _base("Deployment")["spec"]["template"]["spec"]["containers"][0]
    return {source["secretRef"]["name"] for source in container["envFrom"]}


def _in_schema(sql: str, schema: str, role: str = "forklift_keda") -> str:
    """`sql` as written for schema "forklift" and role forklift_keda, for these."""
    assert re.search(r"\bforklift\.", sql), "no forklift.<table> to move"
    sql = re.sub(r"\bforklift_keda\b", f'"{role}"', sql)
    sql = re.sub(r"\bSCHEMA forklift\b", f'SCHEMA "{schema}"', sql)
    return re.sub(r"\bforklift\.", f'"{schema}".', sql)


@pytest.fixture
def keda_role(db: psycopg.Connection[Any], schema: str) -> Iterator[str]:
    """A role with role.sql's grants on this test's schema (a cluster-wide name: unique,
    and dropped after)."""
    role = f"keda_{secrets.token_hex(5)}"
    db.execute(f'CREATE ROLE "{role}" NOLOGIN')
    try:
        db.execute(_in_schema((KEDA / "role.sql").read_text(), schema, role))
        yield role
    finally:
        db.execute(f'DROP OWNED BY "{role}"')
        db.execute(f'DROP ROLE "{role}"')


def _answer(dsn: str, role: str, schema: str, name: str) -> Any:
    """What KEDA reads from the trigger `name`: its query's one value, as `role`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET ROLE "{role}"')
        rows = conn.execute(_in_schema(_query(name), schema)).fetchall()
    assert len(rows) == 1 and len(rows[0]) == 1, rows
    return rows[0][0]


def _seed(db: psycopg.Connection[Any], schema: str) -> None:
    """Due jobs in the served queue (the oldest due 90 s ago), and jobs none of the
    queries may count: scheduled later, running, held under a limit, of another queue."""
    jobs = f'"{schema}".jobs'
    db.execute(
        f"INSERT INTO {jobs} (queue, task, available_at)"
        " SELECT 'default', 't', now() - make_interval(secs => 90 * (i = 1)::int)"
        " FROM generate_series(1, 7) AS i"
    )
    db.execute(
        f"INSERT INTO {jobs} (queue, task, available_at)"
        " SELECT 'default', 't', now() + interval '1 hour' FROM generate_series(1, 3)"
    )
    db.execute(
        f"INSERT INTO {jobs} (queue, task, state, lease_owner)"
        " SELECT 'default', 't', 'running', 'w' FROM generate_series(1, 2)"
    )
    db.execute(
        f"INSERT INTO {jobs} (queue, task, limit_key, available_at)"
        " SELECT 'default', 't', 'k', now() - interval '1 hour' FROM generate_series(1, 4)"
    )
    db.execute(
        f"INSERT INTO {jobs} (queue, task, available_at)"
        " SELECT 'other', 't', now() - interval '2 hours' FROM generate_series(1, 5)"
    )


def test_the_queries_answer_the_due_backlog_and_its_oldest_wait(
    dsn: str, db: psycopg.Connection[Any], schema: str, keda_role: str
) -> None:
    def answers() -> tuple[Any, Any]:
        return (
            _answer(dsn, keda_role, schema, "backlog"),
            _answer(dsn, keda_role, schema, "oldest_ready_age"),
        )

    assert answers() == (0.0, 0.0)  # a number when nothing is due, never NULL
    _seed(db, schema)
    backlog, age = answers()
    assert backlog == 7.0
    assert isinstance(age, float) and 90.0 <= age < 150.0
    # A paused queue is nobody's to drain: more replicas would not claim from it.
    db.execute(f"INSERT INTO \"{schema}\".paused_queues (queue, paused_by) VALUES ('default', 't')")
    assert answers() == (0.0, 0.0)


def test_the_role_reads_nothing_but_the_ready_line(
    dsn: str, db: psycopg.Connection[Any], schema: str, keda_role: str
) -> None:
    _seed(db, schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET ROLE "{keda_role}"')
        for forbidden in (
            f'SELECT args FROM "{schema}".jobs',
            f'SELECT last_error FROM "{schema}".jobs',
            f'UPDATE "{schema}".jobs SET queue = queue',
            f'DELETE FROM "{schema}".paused_queues',
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(forbidden)


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _job_scans(db: psycopg.Connection[Any], schema: str, name: str) -> list[dict[str, Any]]:
    """The plan nodes through which trigger `name`'s query reads jobs (EXPLAIN ANALYZE)."""
    row = db.execute(
        "EXPLAIN (ANALYZE, FORMAT JSON) " + _in_schema(_query(name), schema)
    ).fetchone()
    assert row is not None
    found = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return [n for n in _nodes(found[0]["Plan"]) if n.get("Relation Name") == "jobs"]


def test_the_queries_read_one_index_range_a_queue_whatever_the_backlog(
    db: psycopg.Connection[Any], schema: str
) -> None:
    """A backlog past the cap, more jobs scheduled, of another queue and under a limit:
    each query is an index-only scan of the due jobs' index, reading at most the cap
    (the count) or one entry (the oldest) per served queue."""
    jobs = f'"{schema}".jobs'
    db.execute(
        f"INSERT INTO {jobs} (queue, task, available_at, limit_key)"
        " SELECT q, 't', now() + make_interval(hours => later), nullif(k, '')"
        " FROM (VALUES ('default', 0, '', 1500), ('default', 1, '', 2000),"
        "              ('other', 0, '', 2000), ('default', 0, 'k', 500)) AS v(q, later, k, n),"
        " generate_series(1, n)"
    )
    db.execute(f"ANALYZE {jobs}")
    [cap] = {int(n) for n in re.findall(r"LIMIT (\d+)", _query("backlog"))}
    queues = len(_served(_query("backlog")))
    for name, most in (("backlog", cap * queues), ("oldest_ready_age", queues)):
        scans = _job_scans(db, schema, name)
        assert scans, f"{name}: no scan of jobs in the plan"
        for scan in scans:
            assert scan["Node Type"] == "Index Only Scan", (name, scan["Node Type"])
            assert scan["Index Name"] == "jobs_ready_due_idx", (name, scan["Index Name"])
        read = sum(s["Actual Rows"] * s["Actual Loops"] for s in scans)
        assert 0 < read <= most, (name, read)
    assert db.execute(_in_schema(_query("backlog"), schema)).fetchone() == (float(cap),)
