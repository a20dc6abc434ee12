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
BOOT_CRASH, BOOTED, NOT_COUNTED = (
    RestartCount.BOOT_CRASH,
    RestartCount.BOOTED,
    RestartCount.NONE,
)
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
        ChildFacts(killing=TIMEOUT, timeout_charged=True, held_jobs=True, booted=True),
        SIGKILLED, False, RELEASE, TIMEOUT, BOOTED, WARNING,
    ),
    "timeout kill whose charge failed: the jobs are charged on death": (
        ChildFacts(killing=TIMEOUT, held_jobs=True, booted=True),
        SIGKILLED, False, FAIL, TIMEOUT, BOOTED, WARNING,
    ),
    "timeout kill answered by a clean exit still releases": (
        ChildFacts(killing=TIMEOUT, timeout_charged=True, booted=True),
        CLEAN, False, RELEASE, TIMEOUT, BOOTED, WARNING,
    ),
    "cancel kill: the cancelled job is not its own, bystanders released, no crash": (
        ChildFacts(killing=KillReason.CANCEL, held_jobs=True),
        SIGKILLED, False, RELEASE, KillReason.CANCEL, NOT_COUNTED, WARNING,
    ),
    "memory kill: its jobs fail": (
        ChildFacts(killing=MEMORY, held_jobs=True, booted=True),
        SIGKILLED, False, FAIL, MEMORY, BOOTED, WARNING,
    ),
    "unresponsive kill while booting: its jobs fail, a boot crash": (
        ChildFacts(killing=KillReason.UNRESPONSIVE),
        SIGKILLED, False, FAIL, KillReason.UNRESPONSIVE, BOOT_CRASH, WARNING,
    ),
    "memory kill after a timeout charge: released": (
        ChildFacts(killing=MEMORY, timeout_charged=True, booted=True),
        SIGKILLED, False, RELEASE, MEMORY, BOOTED, WARNING,
    ),
    "killed clean exit before booting: not quiet, fails its jobs, a boot crash": (
        ChildFacts(killing=MEMORY),
        CLEAN, False, FAIL, MEMORY, BOOT_CRASH, WARNING,
    ),
    "killed while stopping: not replaced, not counted": (
        ChildFacts(retiring=SHUTDOWN, killing=TIMEOUT, timeout_charged=True),
        SIGKILLED, True, RELEASE, None, NOT_COUNTED, WARNING,
    ),
    "shutdown, killed at the deadline: released": (
        ChildFacts(retiring=SHUTDOWN, held_jobs=True, booted=True),
        SIGKILLED, True, RELEASE, None, BOOTED, WARNING,
    ),
    "shutdown, clean exit: nothing to record": (
        ChildFacts(retiring=SHUTDOWN),
        CLEAN, True, None, None, NOT_COUNTED, INFO,
    ),
    "shutdown, clean exit still holding jobs: they fail": (
        ChildFacts(retiring=SHUTDOWN, held_jobs=True, booted=True),
        CLEAN, True, FAIL, None, BOOTED, INFO,
    ),
    "crash of a running worker: fails, replaced at once": (
        ChildFacts(held_jobs=True, booted=True),
        CRASHED, False, FAIL, "crash", BOOTED, ERROR,
    ),
    "a running worker killed from outside, however young: replaced at once": (
        ChildFacts(uptime=0.2, booted=True),
        SIGKILLED, False, FAIL, "crash", BOOTED, ERROR,
    ),
    "crash before booting: fails (whatever it held), a boot crash": (
        ChildFacts(uptime=60.0),
        SIGKILLED, False, FAIL, "crash", BOOT_CRASH, ERROR,
    ),
    "recycle: a clean exit of its own accord": (
        ChildFacts(uptime=60.0, booted=True),
        CLEAN, False, None, RetireReason.RECYCLE, BOOTED, INFO,
    ),
    "clean exit still holding jobs: they fail": (
        ChildFacts(held_jobs=True, booted=True),
        CLEAN, False, FAIL, RetireReason.RECYCLE, BOOTED, INFO,
    ),
    "clean exit before booting: no boot crash": (
        ChildFacts(),
        CLEAN, False, None, RetireReason.RECYCLE, NOT_COUNTED, INFO,
    ),
    "scale down, clean: not replaced": (
        ChildFacts(retiring=SCALE_DOWN, booted=True),
        CLEAN, False, None, None, BOOTED, INFO,
    ),
    "scale down, crashed: fails, not replaced": (
        ChildFacts(retiring=SCALE_DOWN, held_jobs=True, booted=True),
        CRASHED, False, FAIL, None, BOOTED, WARNING,
    ),
    "scale down before booting, crashed: not counted": (
        ChildFacts(retiring=SCALE_DOWN),
        CRASHED, False, FAIL, None, NOT_COUNTED, WARNING,
    ),
    "reload, clean: replaced for the reload": (
        ChildFacts(retiring=RELOAD),
        CLEAN, False, None, RELOAD, NOT_COUNTED, INFO,
    ),
    "reload, crashed: fails, replaced, not counted": (
        ChildFacts(retiring=RELOAD),
        CRASHED, False, FAIL, RELOAD, NOT_COUNTED, WARNING,
    ),
    "crash while stopping: fails, not replaced, still an error": (
        ChildFacts(held_jobs=True, booted=True),
        CRASHED, True, FAIL, None, BOOTED, ERROR,
    ),
    "crash while stopping before booting: not counted": (
        ChildFacts(),
        CRASHED, True, FAIL, None, NOT_COUNTED, ERROR,
    ),
    "clean exit while stopping: not replaced": (
        ChildFacts(),
        CLEAN, True, None, None, NOT_COUNTED, INFO,
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
