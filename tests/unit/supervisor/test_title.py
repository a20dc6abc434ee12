"""Process titles."""

from __future__ import annotations

import pytest

from forklift.supervisor.title import ChildTitle, supervisor_title


def test_the_supervisors_title() -> None:
    assert supervisor_title(("default", "mail"), "running", 2, 3, 1) == (
        "forklift supervisor [default,mail]: running, 2/3 workers, 1 busy"
    )


def test_a_childs_title_follows_its_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[str] = []
    monkeypatch.setattr("forklift.supervisor.title.setproctitle", shown.append)
    title = ChildTitle(2, 4, ("default",))
    title.update()
    title.started(7, "render")
    title.started(8, "mail")
    title.ended(7)
    title.ended(8)
    prefix = "forklift worker 2/4 [default]"
    assert shown == [
        f"{prefix}: idle",
        f"{prefix}: running render#7",
        f"{prefix}: running 2 jobs",
        f"{prefix}: running mail#8",
        f"{prefix}: idle",
    ]
