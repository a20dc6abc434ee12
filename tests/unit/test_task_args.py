"""Task.fits / misfit: the fast argument check agrees with inspect's binding."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import forklift

app = forklift.App("postgresql://unused@127.0.0.1/none")


@app.task(name="kw")
def kw(ctx: forklift.JobContext, *, a: int, b: int = 0) -> None: ...


@app.task(name="pos")
def pos(ctx: forklift.JobContext, a: int, b: int = 0) -> None: ...


@app.task(name="anykw")
def anykw(ctx: forklift.JobContext, *, a: int, **rest: Any) -> None: ...


@app.task(name="none")
def none(ctx: forklift.JobContext) -> None: ...


CASES = [{}, {"a": 1}, {"a": 1, "b": 2}, {"b": 2}, {"a": 1, "c": 3}, {"c": 3}]


@pytest.mark.parametrize("task", [kw, pos, anykw, none], ids=lambda t: t.name)
@pytest.mark.parametrize("args", CASES, ids=str)
def test_fast_check_agrees_with_binding(
    task: forklift.Task[Any, Any], args: dict[str, int]
) -> None:
    try:
        inspect.signature(task.fn).bind(None, **args)
        binds = True
    except TypeError:
        binds = False
    assert task.fits(args) is binds
    assert (task.misfit(args) is None) is binds


def test_misfit_says_what_is_wrong() -> None:
    assert "a" in (kw.misfit({}) or "")
    assert "c" in (kw.misfit({"a": 1, "c": 3}) or "")
    with pytest.raises(forklift.ArgumentError, match="'kw'"):
        kw.check_args({"c": 3})


def test_a_task_in_a_script_run_as_main_needs_an_explicit_name() -> None:
    def handler(ctx: forklift.JobContext) -> None: ...

    handler.__module__ = "__main__"
    with pytest.raises(forklift.ConfigError, match="explicit name"):
        app.task(handler)
    named = app.task(name="from_a_script")(handler)
    assert named.name == "from_a_script"
