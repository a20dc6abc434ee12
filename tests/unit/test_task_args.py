"""Task.fits / misfit: the fast argument check agrees with inspect's binding."""

from __future__ import annotations

import inspect
import unicodedata
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


@app.task(name="hash_it")
def hash_it(ctx: forklift.JobContext, *, text: str, rounds: int = 1) -> None: ...


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (
            {"txt": "a"},
            "unknown argument 'txt' (did you mean 'text'?); missing required argument 'text'",
        ),
        ({}, "missing required argument 'text'"),
        ({"text": "a", "zzz": 1}, "unknown argument 'zzz'"),
        (
            {"txt": "a", "rnds": 2},
            "unknown argument 'rnds' (did you mean 'rounds'?); "
            "unknown argument 'txt' (did you mean 'text'?); missing required argument 'text'",
        ),
        # A name already given is no suggestion for another.
        ({"text": "a", "txt": "b"}, "unknown argument 'txt'"),
    ],
)
def test_misfit_names_the_unknown_and_the_missing_arguments(
    args: dict[str, Any], problem: str
) -> None:
    assert hash_it.misfit(args) == problem
    with pytest.raises(forklift.ArgumentError) as raised:
        hash_it.check_args(args)
    assert str(raised.value) == f"task 'hash_it': {problem}"


def test_misfit_names_every_missing_argument() -> None:
    @app.task(name="two")
    def two(ctx: forklift.JobContext, *, a: int, b: int) -> None: ...

    assert two.misfit({}) == "missing required arguments 'a', 'b'"


def test_a_task_is_named_after_its_function_wherever_it_is_defined() -> None:
    def render(ctx: forklift.JobContext) -> None: ...

    render.__module__ = "__main__"  # a script run directly: the worker imports it by name
    one = forklift.App(schema="t_unit")
    assert one.task(render).name == "render"
    assert one.task(name="render_again")(render).name == "render_again"


def test_two_tasks_with_one_name_fail_at_declaration() -> None:
    one = forklift.App(schema="t_unit")

    @one.task
    def render(ctx: forklift.JobContext) -> None: ...

    with pytest.raises(forklift.ConfigError, match=r"two tasks are named 'render'.*name="):

        @one.task(name="render")
        def other(ctx: forklift.JobContext) -> None: ...


def test_an_app_with_tasks_refuses_a_name_it_does_not_know_and_suggests() -> None:
    one = forklift.App("postgresql://nowhere.invalid/x", schema="t_unit")

    @one.task
    def render(ctx: forklift.JobContext) -> None: ...

    with pytest.raises(forklift.UnknownTaskError, match="did you mean 'render'"):
        one.enqueue("rendr")  # refused before any connection is made


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("x\nH not-a-number", "control character \\(U\\+000A\\) at position 1"),
        ("nul\x00", "control character"),
        ("", "must not be empty"),
        ("t" * 201, "201 characters long; the limit is 200"),
        ("half\ud800", "lone surrogate"),
    ],
)
def test_bad_task_and_queue_names_are_refused_at_declaration(name: str, problem: str) -> None:
    one = forklift.App(schema="t_unit")

    def handler(ctx: forklift.JobContext) -> None: ...

    with pytest.raises(forklift.ConfigError, match=problem):
        one.task(name=name)(handler)
    with pytest.raises(forklift.ConfigError, match="queue name"):
        one.task(name="fine", queue=name)(handler)


# -- enqueue validation, fuzzed: anything is refused cleanly or stored as given -----------

producer = forklift.App("postgresql://nowhere.invalid/x", schema="t_unit")


@given(task=st.text(max_size=300), queue=st.text(max_size=300), key=st.text(max_size=700))
def test_any_name_is_refused_with_an_argument_error_or_accepted_intact(
    task: str, queue: str, key: str
) -> None:
    try:
        job = producer._new_job(task, {}, queue=queue, idempotency_key=key)
    except forklift.ArgumentError as exc:
        assert "name" in str(exc)
        return
    assert (job.task, job.queue, job.idempotency_key) == (task, queue, key)
    for name in (task, queue, key):
        name.encode("utf-8")  # storable
        assert name and not any(unicodedata.category(c) == "Cc" for c in name)
    assert len(task) <= 200 and len(queue) <= 200 and len(key) <= 512


def test_a_ten_kilobyte_key_is_refused_before_the_database_sees_it() -> None:
    with pytest.raises(forklift.ArgumentError, match="10000 characters long; the limit is 512"):
        producer._new_job("noop", {}, idempotency_key="k" * 10_000)


@pytest.mark.parametrize(
    "option",
    ["delay", "priority", "queue", "run_at", "max_attempts", "max_crashes", "conn",
     "idempotency_key"],
)  # fmt: skip
def test_a_parameter_named_like_an_enqueue_option_is_refused_at_declaration(
    option: str,
) -> None:
    local = forklift.App("postgresql://unused@127.0.0.1/none")
    namespace: dict[str, Any] = {"forklift": forklift}
    exec(f"def handler(ctx, *, {option}, other=1): pass", namespace)
    with pytest.raises(forklift.ConfigError) as refused:
        local.task(name="clash")(namespace["handler"])
    message = str(refused.value)
    assert f"parameter {option!r} is named like an enqueue() option" in message
    assert f"clash.enqueue({option}=...)" in message and "rename it" in message
    assert "clash" not in local.tasks


def test_every_way_to_enqueue_takes_one_option_set() -> None:
    from forklift.app import App, JobOptions, JobSpec
    from forklift.task import ENQUEUE_OPTIONS, Task

    options = set(JobOptions.__annotations__)

    def keywords(fn: Any) -> set[str]:
        """Its keyword-only parameters, and JobOptions' keys if it takes them as such."""
        params = inspect.signature(fn).parameters.values()
        named = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
        typed = [p for p in params if p.annotation == "Unpack[JobOptions]"]
        return named | (options if typed else set())

    # The call's own `timeout` (its wait for the database) is the App's only: through
    # task.enqueue(**args) it would take a handler parameter's name from every task (a
    # handler may well take a `timeout`); there the App's enqueue_timeout applies.
    for app_way in (App.enqueue, App.enqueue_async):
        assert keywords(app_way) == options | {"conn", "timeout"}, app_way
    for task_way in (Task.enqueue, Task.enqueue_async):
        assert keywords(task_way) == options | {"conn"}, task_way
    assert set(ENQUEUE_OPTIONS) == options | {"conn"}
    assert set(JobSpec.__dataclass_fields__) == options | {"task", "args"}


def test_args_over_the_cap_are_refused_by_default_at_one_mebibyte(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from forklift._job import JobSpec, build
    from forklift.app import MAX_ARG_BYTES

    monkeypatch.delenv("FORKLIFT_MAX_ARG_BYTES", raising=False)
    assert MAX_ARG_BYTES == 1 << 20 == forklift.App().max_arg_bytes
    at_the_cap = {"a": "x" * (MAX_ARG_BYTES - len('{"a":""}'))}
    build(JobSpec("t", at_the_cap), None)
    with pytest.raises(forklift.ArgumentError, match="1,048,577 bytes of JSON, more than"):
        build(JobSpec("t", {"a": "x" * (MAX_ARG_BYTES - len('{"a":""}') + 1)}), None)
    with pytest.raises(forklift.ArgumentError, match="more than the 1,048,576"):
        build(JobSpec("t", {"a": "é" * (MAX_ARG_BYTES // 2)}), None)  # counted in UTF-8 bytes


def test_the_cap_is_set_on_the_app_or_by_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FORKLIFT_MAX_ARG_BYTES", "64")
    assert forklift.App().max_arg_bytes == 64
    assert forklift.App(max_arg_bytes=10_000).max_arg_bytes == 10_000
    local = forklift.App()
    with pytest.raises(forklift.ArgumentError, match="more than the 64 a job may take"):
        local._new_job("t", {"a": "x" * 64})
    monkeypatch.setenv("FORKLIFT_MAX_ARG_BYTES", "lots")
    with pytest.raises(forklift.ConfigError, match="FORKLIFT_MAX_ARG_BYTES='lots'"):
        forklift.App()
    with pytest.raises(forklift.ConfigError, match="max_arg_bytes must be >= 1"):
        forklift.App(max_arg_bytes=0)
