"""describe_exit: a wait status in words an operator can act on."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from forklift.supervisor.exits import describe_exit, signal_name


def real_status(code: str) -> int:
    """The waitpid status of a fresh interpreter running `code`, as the kernel encodes it.

    posix_spawn rather than fork: the test process itself never forks.
    """
    argv = [sys.executable, "-I", "-S", "-c", code]
    pid = os.posix_spawn(sys.executable, argv, {})
    _, status = os.waitpid(pid, 0)
    return status


def exited(code: int) -> int:
    return real_status(f"import os; os._exit({code})")


def killed(signum: int) -> int:
    # No core file: a SIGSEGV child must not litter the working directory.
    return real_status(
        "import os, resource; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); "
        f"os.kill(os.getpid(), {signum}); os._exit(99)"
    )


def test_real_statuses_have_the_kernel_encoding() -> None:
    assert exited(3) == 3 << 8
    assert exited(0) == 0
    assert killed(signal.SIGKILL) == signal.SIGKILL
    assert killed(signal.SIGSEGV) == signal.SIGSEGV


def test_describes_an_exit_code() -> None:
    assert describe_exit(exited(3)) == "WorkerDied: worker process exited with code 3"


def test_describes_sigkill_as_possibly_out_of_memory() -> None:
    text = describe_exit(killed(signal.SIGKILL))
    assert text.startswith("WorkerDied: worker process killed by SIGKILL: ")
    assert "out of memory" in text


def test_describes_sigsegv_as_a_segmentation_fault() -> None:
    text = describe_exit(killed(signal.SIGSEGV))
    assert "killed by SIGSEGV" in text
    assert "segmentation fault" in text


def test_a_signal_without_a_likely_reason_is_just_named() -> None:
    assert describe_exit(killed(signal.SIGUSR1)) == "WorkerDied: worker process killed by SIGUSR1"


def test_the_supervisors_cause_replaces_the_guess() -> None:
    cause = "memory limit: RSS 240 MiB passed 1.5 x the 150 MiB limit"
    text = describe_exit(killed(signal.SIGKILL), cause=cause)
    assert text == f"WorkerDied: worker process killed by SIGKILL: {cause}"
    assert "out of memory" not in text


def test_the_supervisors_cause_is_appended_to_an_exit_code() -> None:
    text = describe_exit(exited(1), cause="job render#7 timed out after 5 s")
    assert text == "WorkerDied: worker process exited with code 1: job render#7 timed out after 5 s"


def test_peak_rss_is_rendered_in_mib() -> None:
    text = describe_exit(killed(signal.SIGKILL), peak_rss_bytes=300 * 2**20 + 12345)
    assert text.endswith(" (peak RSS 300 MiB)")
    assert "out of memory" in text
    assert describe_exit(exited(2), peak_rss_bytes=int(1.6 * 2**20)).endswith("(peak RSS 2 MiB)")


@pytest.mark.parametrize("peak", [None, 0])
def test_no_peak_rss_no_mention(peak: int | None) -> None:
    assert "RSS" not in describe_exit(exited(3), peak_rss_bytes=peak)


def test_every_description_starts_with_worker_died() -> None:
    statuses = [exited(0), exited(3), exited(255), killed(signal.SIGKILL), killed(signal.SIGTERM)]
    statuses += [killed(signal.SIGSEGV), killed(signal.SIGABRT), killed(signal.SIGUSR2)]
    for status in statuses:
        for kwargs in ({}, {"cause": "why"}, {"peak_rss_bytes": 2**30}):
            assert describe_exit(status, **kwargs).startswith("WorkerDied: ")


def test_signal_name() -> None:
    assert signal_name(signal.SIGKILL) == "SIGKILL"
    assert signal_name(signal.SIGSEGV.value) == "SIGSEGV"
    assert signal_name(200) == "signal 200"
