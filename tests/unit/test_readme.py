"""README.md, CONTRIBUTING.md and bench/README.md stay true: the two commands a fresh
machine needs come first and are what CI runs, and the commands the pages name exist.

The flags are documented by the CLI reference, which the documentation site generates
from the parser at every build (tests/unit/test_docs.py builds it)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_two_commands_come_first_each_alone_in_its_block() -> None:
    blocks = re.findall(r"```sh\n(.*?)```", README, re.DOTALL)
    assert blocks[:2] == ["scripts/demo\n", "scripts/test\n"]
    for script in ("demo", "test", "setup"):
        assert (ROOT / "scripts" / script).stat().st_mode & 0o111, f"scripts/{script}"


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"(?m)^scripts/test( \|\| status=\$\?)?$", ci), "README's test command"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "```sh\nscripts/test\n```\n\nis the test command" in readme
    assert "`.ci/run` calls exactly `scripts/test`" in readme
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert "scripts/test" in contributing and ".ci/run" in contributing


def test_every_benchmark_in_the_bench_readme_is_a_module_that_imports() -> None:
    bench = (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
    modules = re.findall(r"`\.venv/bin/python -m (bench\.\w+)`", bench)
    assert modules, "the benchmarks table is gone"
    for name in modules:
        assert hasattr(importlib.import_module(name), "main"), name


def test_the_quickstart_example_app_exists() -> None:
    guide = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert "examples.primes:app" in guide
    assert importlib.import_module("examples.primes").app.tasks.keys() == {"count_primes"}
