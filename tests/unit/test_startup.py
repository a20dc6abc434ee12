"""Start-up stays light: what `forklift --help` and the CLI's import load, in a fresh
interpreter (sys.modules, not timings: bench/cpu.py times them)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

# What no command needs just to start: each is imported by the commands that use it.
HEAVY_PACKAGES = (
    "asyncio", "cronsim", "flask", "prometheus_client", "psycopg", "psycopg_pool", "rich",
    "setproctitle", "waitress",
)  # fmt: skip
HEAVY_MODULES = (
    "forklift.admin", "forklift.app", "forklift.dashboard", "forklift.demo", "forklift.metrics",
    "forklift.store", "forklift.supervisor.arbiter", "forklift.workers.worker",
)  # fmt: skip


def loaded_after(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running `code`."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout.splitlines()[-1])
    return found


def heavy(modules: list[str]) -> list[str]:
    return [
        m
        for m in modules
        if m.split(".")[0] in HEAVY_PACKAGES
        or any(m == h or m.startswith(h + ".") for h in HEAVY_MODULES)
    ]


def test_the_cli_and_its_parser_import_nothing_heavy() -> None:
    code = "import forklift.cli\nforklift.cli.build_parser().parse_args(['status'])"
    assert heavy(loaded_after(code)) == []
    code = "import forklift.cli\nforklift.cli.build_parser('run')"
    assert [m for m in loaded_after(code) if m.startswith("forklift.cli.")] == [
        "forklift.cli.apps", "forklift.cli.errors", "forklift.cli.flags", "forklift.cli.processes",
    ]  # fmt: skip


def test_import_forklift_loads_the_public_api_on_first_use() -> None:
    assert heavy(loaded_after("import forklift")) == []
    code = "import forklift\nassert forklift.App.__module__ == 'forklift.app'"
    assert "forklift.app" in loaded_after(code)
    code = "from forklift import JobContext, Limit, WorkerConfig"
    assert "forklift.workers.context" in loaded_after(code)


def test_the_public_api_is_complete_and_listed() -> None:
    import forklift

    for name in forklift.__all__:
        assert getattr(forklift, name) is not None, name
        assert name in dir(forklift)


def test_the_run_path_leaves_what_only_the_parent_serves_until_after_the_first_fork() -> None:
    """`forklift run` forks its first children before it imports the HTTP server,
    prometheus_client and the operator's store (arbiter.py); the children never do."""
    code = "import forklift.cli, forklift.supervisor.arbiter, forklift.supervisor.reload"
    later = (
        "cronsim", "flask", "forklift.admin", "forklift.dashboard", "forklift.demo",
        "forklift.supervisor.http", "forklift.supervisor.served", "prometheus_client", "rich",
        "waitress",
    )  # fmt: skip
    assert [m for m in loaded_after(code) if m.startswith(later)] == []


def test_each_command_builds_its_own_group_parser_only() -> None:
    """GROUP_OF names, for every command, the group that registers it."""
    from forklift import cli

    def commands(parser: argparse.ArgumentParser) -> set[str]:
        found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return set(found[0].choices)

    everything = commands(cli.build_parser())
    assert set(cli.GROUP_OF) == everything
    for command in everything:
        alone = commands(cli.build_parser(command))
        assert command in alone and alone < everything
