"""What the deploy tests read from the code, so deploy files cannot drift from it: the
CLI's parsed flags and the shutdown budget, the HTTP routes, every exported metric name;
and the tools they run (skipped, with the reason, where one is not installed)."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import forklift
from forklift.cli import build_parser, flags
from forklift.supervisor import Supervisor
from forklift.supervisor.config import SupervisorConfig

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


@contextlib.contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """os.environ with no FORKLIFT_* or DATABASE_URL but those in `env`, for the block:
    flag defaults are read from the environment when the parser is built."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith("FORKLIFT_") or name == "DATABASE_URL":
            del os.environ[name]
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def parse_run(argv: Sequence[str], env: Mapping[str, str] = {}) -> argparse.Namespace:
    """`forklift ARGV...` as the CLI parses it under `env` (argv without the binary)."""
    with environment(env):
        return build_parser().parse_args(list(argv))


def run_config(argv: Sequence[str], env: Mapping[str, str] = {}) -> SupervisorConfig:
    """The SupervisorConfig a `forklift run ...` command line makes under `env`."""
    args = parse_run(argv, env)
    assert args.command == "run", f"not a `forklift run` command line: {argv}"
    return flags.supervisor_config(args)


def metrics_port(argv: Sequence[str], env: Mapping[str, str] = {}) -> tuple[str, int]:
    """Where `forklift run ARGV` serves /metrics, /healthz and /readyz (host, port)."""
    host, _, port = parse_run(argv, env).metrics_addr.rpartition(":")
    return host, int(port)


def routes() -> set[str]:
    """The paths the supervisor's HTTP server answers."""
    return set(_supervisor(forklift.App("postgresql://unused", schema="unused")).served().routes)


def _supervisor(app: forklift.App) -> Supervisor:
    # Supervisor.__init__ does no I/O, nor served(): its routes and metrics are wired but
    # not served.
    return Supervisor(app, SupervisorConfig(workers=1))


def exported_metrics(dsn: str, schema: str) -> set[str]:
    """Every series name a supervisor's /metrics can expose (`forklift_jobs_total`,
    `forklift_job_duration_seconds_bucket`, ...), from its own registry."""
    sup = _supervisor(forklift.App(dsn, schema=schema))
    served = sup.served()
    try:
        served.probes.refresh()  # what the database thread reads for the scrapes
        served.probes.refresh_stats()
    finally:
        assert sup.store.held is not None
        sup.store.held.close()  # the database thread's connection, opened by the refresh
    status, _, body = served.routes["/metrics"]()
    assert status == 200
    names: set[str] = set()
    for family in text_string_to_metric_families(body.decode()):
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}_{part}" for part in ("bucket", "sum", "count"))
        else:
            names.add(family.name)
    return names


# PromQL words that look like metric names but are not.
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}


def promql_metrics(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (Grafana's $variables allowed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings: label values, formats
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\$\{?\w+\}?", "", text)  # $__rate_interval, ${queue}
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        if match[2] is None and match[1].lower() not in _KEYWORDS:
            names.add(match[1])
    return names


@contextlib.contextmanager
def running(
    argv: Sequence[str], env: Mapping[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """`argv` in a session of its own, its output in `log`; on the way out, whatever of
    that session is left is SIGKILLed, and it is reaped."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
