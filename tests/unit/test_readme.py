"""README.md stays true: its flag table is the parser's, its commands exist as written."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from forklift.cli import build_parser, reference

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_flag_table_is_generated_from_the_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FORKLIFT_SCHEMA", "FORKLIFT_WORKERS", "FORKLIFT_LOG_FORMAT"):
        monkeypatch.delenv(name, raising=False)  # defaults as a fresh shell has them
    expected = reference.spliced(README, reference.table(build_parser()))
    assert expected == README, "run: python -m forklift.cli.reference --update README.md"


def test_the_two_commands_come_first_each_alone_in_its_block() -> None:
    blocks = re.findall(r"```sh\n(.*?)```", README, re.DOTALL)
    assert blocks[:2] == ["scripts/demo\n", "scripts/test\n"]
    for script in ("demo", "test", "setup"):
        assert (ROOT / "scripts" / script).stat().st_mode & 0o111, f"scripts/{script}"


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"(?m)^scripts/test( \|\| status=\$\?)?$", ci), "README's test command"


def test_every_benchmark_in_the_readme_is_a_module_that_imports() -> None:
    modules = re.findall(r"`\.venv/bin/python -m (bench\.\w+)`", README)
    assert modules, "the benchmarks table is gone"
    for name in modules:
        assert hasattr(importlib.import_module(name), "main"), name


def test_the_quickstart_example_app_exists() -> None:
    assert "examples.primes:app" in README
    assert importlib.import_module("examples.primes").app.tasks.keys() == {"count_primes"}
