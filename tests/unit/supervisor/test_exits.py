"""The exit decision, as a table: every branch of what a child's exit means."""

from __future__ import annotations

import logging
import signal

import pytest

from forklift.supervisor.exits import (
    ChildFacts,
    ExitStatus,
    RestartCount,
    RestartReason,
    decide,
)
from forklift.supervisor.states import JobsAction, KillReason, RetireReason

CLEAN = ExitStatus("WorkerDied: worker process exited with code 0", clean=True)
CRASHED = ExitStatus("WorkerDied: worker process exited with code 3", clean=False)
SIGKILLED = ExitStatus("WorkerDied: worker process killed by SIGKILL: why", clean=False)

TIMEOUT = KillReason.TIMEOUT
MEMORY = KillReason.MEMORY
SHUTDOWN = RetireReason.SHUTDOWN
SCALE_DOWN = RetireReason.SCALE_DOWN
RELOAD = RetireReason.RELOAD
FAIL, RELEASE = JobsAction.FAIL, JobsAction.RELEASE
CRASH, COUNTED_CLEAN, NOT_COUNTED = RestartCount.CRASH, RestartCount.CLEAN, RestartCount.NONE
INFO, WARNING, ERROR = logging.INFO, logging.WARNING, logging.ERROR

Row = tuple[
    ChildFacts,
    ExitStatus,
    bool,
    JobsAction | None,
    RestartReason | None,
    RestartCount,
    int,
]

# facts, exit, stopping -> jobs, restart reason (None: not replaced), backoff, log level
TABLE: dict[str, Row] = {
    "timeout kill whose job was charged: the bystanders are released": (
        ChildFacts(killing=TIMEOUT, timeout_charged=True, held_jobs=True),
        SIGKILLED, False, RELEASE, TIMEOUT, CRASH, WARNING,
    ),
    "timeout kill whose charge failed: the jobs are charged on death": (
        ChildFacts(killing=TIMEOUT, held_jobs=True),
        SIGKILLED, False, FAIL, TIMEOUT, CRASH, WARNING,
    ),
    "timeout kill answered by a clean exit still releases": (
        ChildFacts(killing=TIMEOUT, timeout_charged=True),
        CLEAN, False, RELEASE, TIMEOUT, CRASH, WARNING,
    ),
    "cancel kill: the cancelled job is not its own, bystanders released, no crash": (
        ChildFacts(killing=KillReason.CANCEL, held_jobs=True),
        SIGKILLED, False, RELEASE, KillReason.CANCEL, NOT_COUNTED, WARNING,
    ),
    "memory kill: its jobs fail": (
        ChildFacts(killing=MEMORY, held_jobs=True),
        SIGKILLED, False, FAIL, MEMORY, CRASH, WARNING,
    ),
    "unresponsive kill: its jobs fail": (
        ChildFacts(killing=KillReason.UNRESPONSIVE),
        SIGKILLED, False, FAIL, KillReason.UNRESPONSIVE, CRASH, WARNING,
    ),
    "memory kill after a timeout charge: released": (
        ChildFacts(killing=MEMORY, timeout_charged=True),
        SIGKILLED, False, RELEASE, MEMORY, CRASH, WARNING,
    ),
    "killed clean exit: not quiet, still fails its jobs": (
        ChildFacts(killing=MEMORY),
        CLEAN, False, FAIL, MEMORY, CRASH, WARNING,
    ),
    "killed while stopping: not replaced, not counted": (
        ChildFacts(retiring=SHUTDOWN, killing=TIMEOUT, timeout_charged=True),
        SIGKILLED, True, RELEASE, None, NOT_COUNTED, WARNING,
    ),
    "shutdown, killed at the deadline: released": (
        ChildFacts(retiring=SHUTDOWN, held_jobs=True),
        SIGKILLED, True, RELEASE, None, NOT_COUNTED, WARNING,
    ),
    "shutdown, clean exit: nothing to record": (
        ChildFacts(retiring=SHUTDOWN),
        CLEAN, True, None, None, COUNTED_CLEAN, INFO,
    ),
    "shutdown, clean exit still holding jobs: they fail": (
        ChildFacts(retiring=SHUTDOWN, held_jobs=True),
        CLEAN, True, FAIL, None, COUNTED_CLEAN, INFO,
    ),
    "crash: fails, replaced, counted": (
        ChildFacts(held_jobs=True),
        CRASHED, False, FAIL, "crash", CRASH, ERROR,
    ),
    "crash holding nothing still fails (whatever it held)": (
        ChildFacts(),
        SIGKILLED, False, FAIL, "crash", CRASH, ERROR,
    ),
    "recycle: a clean exit of its own accord": (
        ChildFacts(uptime=60.0),
        CLEAN, False, None, RetireReason.RECYCLE, COUNTED_CLEAN, INFO,
    ),
    "clean exit still holding jobs: they fail": (
        ChildFacts(held_jobs=True),
        CLEAN, False, FAIL, RetireReason.RECYCLE, COUNTED_CLEAN, INFO,
    ),
    "scale down, clean: not replaced": (
        ChildFacts(retiring=SCALE_DOWN),
        CLEAN, False, None, None, COUNTED_CLEAN, INFO,
    ),
    "scale down, crashed: fails, not replaced, not counted": (
        ChildFacts(retiring=SCALE_DOWN, held_jobs=True),
        CRASHED, False, FAIL, None, NOT_COUNTED, WARNING,
    ),
    "reload, clean: replaced for the reload": (
        ChildFacts(retiring=RELOAD),
        CLEAN, False, None, RELOAD, COUNTED_CLEAN, INFO,
    ),
    "reload, crashed: fails, replaced, not counted": (
        ChildFacts(retiring=RELOAD),
        CRASHED, False, FAIL, RELOAD, NOT_COUNTED, WARNING,
    ),
    "crash while stopping: fails, not replaced, not counted, still an error": (
        ChildFacts(held_jobs=True),
        CRASHED, True, FAIL, None, NOT_COUNTED, ERROR,
    ),
    "clean exit while stopping: not replaced": (
        ChildFacts(),
        CLEAN, True, None, None, COUNTED_CLEAN, INFO,
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", TABLE, ids=str)
def test_decide(case: str) -> None:
    facts, exit, stopping, jobs, restart, counts, level = TABLE[case]
    verdict = decide(facts, exit, stopping=stopping)
    assert verdict.jobs == jobs
    assert verdict.replaced == (restart is not None)
    assert verdict.restart_reason == restart
    assert verdict.counts == counts
    assert verdict.level == level
    assert verdict.error == exit.described


@pytest.mark.parametrize("case", TABLE, ids=str)
def test_only_a_clean_exit_of_its_own_accord_is_quiet(case: str) -> None:
    facts, exit, stopping, *_ = TABLE[case]
    verdict = decide(facts, exit, stopping=stopping)
    assert verdict.quiet == (exit.clean and facts.killing is None)
    assert verdict.reason == ("clean exit" if verdict.quiet else exit.described)
    assert (verdict.level == INFO) == verdict.quiet


def test_the_verdict_is_frozen() -> None:
    verdict = decide(ChildFacts(), CRASHED, stopping=False)
    with pytest.raises(AttributeError):
        verdict.jobs = None  # type: ignore[misc]


@pytest.mark.parametrize(
    ("status", "clean", "words"),
    [
        (0, True, "exited with code 0"),
        (3 << 8, False, "exited with code 3"),
        (signal.SIGKILL.value, False, "killed by SIGKILL: possibly out of memory"),
    ],
)
def test_exit_status_of_a_wait_status(status: int, clean: bool, words: str) -> None:
    exit = ExitStatus.of(status)
    assert exit.clean is clean
    assert words in exit.described


def test_exit_status_carries_the_supervisors_cause_and_the_peak_rss() -> None:
    exit = ExitStatus.of(signal.SIGKILL.value, 300 * 2**20, "memory limit")
    assert exit.described == (
        "WorkerDied: worker process killed by SIGKILL: memory limit (peak RSS 300 MiB)"
    )
