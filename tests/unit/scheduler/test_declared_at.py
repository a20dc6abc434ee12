"""A schedule declared wrongly is refused at its declaration, naming the user's file and
line (not the line of forklift's that found the mistake), in the message and as the
innermost frame of the traceback, which `forklift run`'s one-line error names."""

from __future__ import annotations

import sys
import textwrap
import traceback
from pathlib import Path

import pytest

import forklift
from forklift.cli import main

HERE = Path(__file__)


def line_after() -> int:
    """The number of the line after the caller's."""
    return sys._getframe(1).f_lineno + 1


def innermost(exc: BaseException) -> tuple[str, int | None]:
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return frame.filename, frame.lineno


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> forklift.App:
    monkeypatch.chdir(HERE.parent)  # paths show relative to the current directory
    return forklift.App("postgresql://nowhere/x")


def test_a_bad_cron_in_the_decorator_names_the_decorators_line(app: forklift.App) -> None:
    with pytest.raises(forklift.ConfigError) as raised:
        line = line_after()

        @app.periodic(cron="61 * * * *")
        def tick(ctx: forklift.JobContext) -> None:
            pass

    assert str(raised.value).startswith(f"{HERE.name}:{line + 1}: cron expression '61 * * * *'")
    assert innermost(raised.value) == (str(HERE), line + 1)
    assert app.tasks == {} and app.schedules == {}


def test_a_bad_cron_for_a_registered_task_names_the_calls_line(app: forklift.App) -> None:
    @app.task
    def tick(ctx: forklift.JobContext) -> None:
        pass

    with pytest.raises(forklift.ConfigError) as raised:
        line = line_after()
        app.periodic(task=tick, cron="0 0 31 2 *")
    assert str(raised.value).startswith(f"{HERE.name}:{line}: cron expression '0 0 31 2 *'")
    assert innermost(raised.value) == (str(HERE), line)


def test_what_only_the_decorated_function_shows_is_located_too(app: forklift.App) -> None:
    # Arguments the function cannot take are found when the decorator is applied.
    with pytest.raises(forklift.ConfigError) as raised:
        line = line_after()

        @app.periodic(every=60, args={"nope": 1})
        def tick(ctx: forklift.JobContext) -> None:
            pass

    message = str(raised.value)
    assert message.startswith(f"{HERE.name}:{line + 1}: schedule 'tick'"), message
    assert message.count(f"{HERE.name}:") == 1 and "unknown argument 'nope'" in message
    assert app.tasks == {}


def test_a_file_outside_the_current_directory_shows_its_whole_path(
    app: forklift.App, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(forklift.ConfigError) as raised:
        line = line_after()
        app.periodic(task="tick", every=60, tz="Europe/Zagreb")
    assert str(raised.value).startswith(f"{HERE}:{line}: tz= applies to cron= schedules")


def test_forklift_run_names_the_apps_line_not_forklifts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app_source = """\
        import forklift

        app = forklift.App("postgresql://nowhere/x")


        @app.periodic(cron="0 25 * * *", tz="Europe/Zagreb")
        def nightly(ctx: forklift.JobContext) -> None:
            pass
    """
    (tmp_path / "h5_badcron.py").write_text(textwrap.dedent(app_source))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    assert main(["run", "h5_badcron:app"]) == 3
    [said] = capsys.readouterr().err.splitlines()
    assert "ConfigError: h5_badcron.py:6: cron expression '0 25 * * *'" in said, said
    assert said.count("(at ") == 1 and f"(at {tmp_path / 'h5_badcron.py'}:6)" in said, said
    assert "forklift/scheduler" not in said
