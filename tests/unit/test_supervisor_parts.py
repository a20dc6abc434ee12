"""The supervisor's pure parts: restarts, autoscaling, death reports, child reports, config."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator

import pytest

from forklift.supervisor.autoscale import Autoscaler
from forklift.supervisor.child import (
    Child,
    Reporter,
    RunningJob,
)
from forklift.supervisor.config import SupervisorConfig
from forklift.supervisor.death import describe_exit, signal_name
from forklift.supervisor.restarts import RestartPolicy
from forklift.workers.config import WorkerConfig

# -- RestartPolicy --------------------------------------------------------------------------


def test_a_crash_after_running_a_while_restarts_at_once() -> None:
    policy = RestartPolicy(fast_crash=5.0)
    assert policy.crashed(now=100.0, uptime=60.0) == 0.0
    assert policy.crashed(now=200.0, uptime=5.0) == 0.0  # exactly fast_crash is not fast
    assert not policy.in_crash_loop(200.0)


def test_consecutive_fast_crashes_double_the_delay_up_to_the_cap() -> None:
    policy = RestartPolicy(fast_crash=5.0, base=0.5, max_delay=30.0, window=1e9, loop_crashes=99)
    delays = [policy.crashed(now=float(t), uptime=1.0) for t in range(9)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_the_cap_applies_even_when_it_is_not_a_power_of_two_step() -> None:
    policy = RestartPolicy(base=0.5, max_delay=3.0)
    assert [policy.crashed(now=float(t), uptime=0.1) for t in range(5)] == [0.5, 1, 2, 3, 3]


def test_a_slow_crash_resets_the_streak() -> None:
    policy = RestartPolicy(fast_crash=5.0, base=0.5)
    assert [policy.crashed(now=float(t), uptime=1.0) for t in range(3)] == [0.5, 1.0, 2.0]
    assert policy.crashed(now=3.0, uptime=30.0) == 0.0
    assert policy.crashed(now=40.0, uptime=1.0) == 0.5


def test_healthy_resets_the_streak() -> None:
    policy = RestartPolicy(base=0.5)
    assert [policy.crashed(now=float(t), uptime=0.0) for t in range(4)] == [0.5, 1, 2, 4]
    policy.healthy()
    assert policy.crashed(now=10.0, uptime=0.0) == 0.5


def test_crash_loop_after_loop_crashes_fast_crashes_within_the_window() -> None:
    policy = RestartPolicy(fast_crash=5.0, loop_crashes=5, window=60.0)
    for t in (0.0, 10.0, 20.0, 30.0):
        policy.crashed(now=t, uptime=1.0)
        assert not policy.in_crash_loop(t)
    policy.crashed(now=40.0, uptime=1.0)
    assert policy.in_crash_loop(40.0)
    assert policy.in_crash_loop(60.0)  # the crash at 0 is exactly `window` old: still inside
    # The crash at 0 ages out: four left, no longer a loop, and it stays that way.
    assert not policy.in_crash_loop(60.5)
    assert not policy.in_crash_loop(1000.0)


def test_crashes_spread_wider_than_the_window_are_not_a_loop() -> None:
    policy = RestartPolicy(fast_crash=5.0, loop_crashes=5, window=60.0)
    for i in range(20):
        now = i * 16.0  # only four fit in any 60 s window
        policy.crashed(now=now, uptime=1.0)
        assert not policy.in_crash_loop(now)


def test_slow_crashes_never_make_a_crash_loop() -> None:
    policy = RestartPolicy(fast_crash=5.0, loop_crashes=5, window=60.0)
    for t in range(10):
        assert policy.crashed(now=float(t), uptime=6.0) == 0.0
    assert not policy.in_crash_loop(10.0)


# -- Autoscaler -----------------------------------------------------------------------------


def test_scales_up_by_one_when_there_is_a_backlog_and_every_child_is_busy() -> None:
    scaler = Autoscaler(1, 5, up_cooldown=2.0)
    assert scaler.decide(100.0, current=2, backlog=10, busy=2, longest_idle=0.0) == 1


def test_does_not_scale_up_while_some_child_is_idle() -> None:
    scaler = Autoscaler(1, 5)
    assert scaler.decide(100.0, current=2, backlog=10, busy=1, longest_idle=1.0) == 0


def test_does_not_scale_up_again_within_the_up_cooldown() -> None:
    scaler = Autoscaler(1, 5, up_cooldown=2.0)
    assert scaler.decide(100.0, current=1, backlog=10, busy=1, longest_idle=0.0) == 1
    assert scaler.decide(101.0, current=2, backlog=10, busy=2, longest_idle=0.0) == 0
    assert scaler.decide(101.9, current=2, backlog=10, busy=2, longest_idle=0.0) == 0
    assert scaler.decide(102.0, current=2, backlog=10, busy=2, longest_idle=0.0) == 1


def test_never_scales_above_the_maximum() -> None:
    scaler = Autoscaler(1, 3, up_cooldown=2.0)
    for t in range(0, 100, 2):
        assert scaler.decide(float(t), current=3, backlog=1000, busy=3, longest_idle=0.0) == 0


def test_scales_down_when_idle_long_enough_and_only_after_the_down_cooldown() -> None:
    scaler = Autoscaler(1, 5, down_cooldown=10.0, idle_for=15.0)
    assert scaler.decide(100.0, current=3, backlog=0, busy=0, longest_idle=14.9) == 0
    assert scaler.decide(100.0, current=3, backlog=0, busy=0, longest_idle=15.0) == -1
    assert scaler.decide(105.0, current=2, backlog=0, busy=0, longest_idle=40.0) == 0
    assert scaler.decide(109.9, current=2, backlog=0, busy=0, longest_idle=40.0) == 0
    assert scaler.decide(110.0, current=2, backlog=0, busy=0, longest_idle=40.0) == -1


def test_a_scale_up_also_starts_the_down_cooldown() -> None:
    scaler = Autoscaler(1, 5, up_cooldown=2.0, down_cooldown=10.0, idle_for=15.0)
    assert scaler.decide(100.0, current=2, backlog=5, busy=2, longest_idle=0.0) == 1
    assert scaler.decide(105.0, current=3, backlog=0, busy=0, longest_idle=20.0) == 0
    assert scaler.decide(110.0, current=3, backlog=0, busy=0, longest_idle=20.0) == -1


def test_does_not_scale_down_while_there_is_a_backlog() -> None:
    scaler = Autoscaler(1, 5)
    assert scaler.decide(100.0, current=3, backlog=1, busy=2, longest_idle=1000.0) == 0


def test_never_scales_below_the_minimum() -> None:
    scaler = Autoscaler(2, 5, down_cooldown=10.0, idle_for=15.0)
    for t in range(0, 200, 2):
        assert scaler.decide(float(t), current=2, backlog=0, busy=0, longest_idle=1e6) == 0


def test_below_the_minimum_adds_and_above_the_maximum_removes_regardless_of_cooldowns() -> None:
    scaler = Autoscaler(2, 4, up_cooldown=2.0, down_cooldown=10.0)
    assert scaler.decide(100.0, current=3, backlog=5, busy=3, longest_idle=0.0) == 1  # cooldown
    assert scaler.decide(100.1, current=1, backlog=0, busy=0, longest_idle=100.0) == 1
    assert scaler.decide(100.2, current=0, backlog=0, busy=0, longest_idle=0.0) == 1
    assert scaler.decide(100.3, current=5, backlog=100, busy=5, longest_idle=0.0) == -1
    assert scaler.decide(100.4, current=9, backlog=0, busy=0, longest_idle=0.0) == -1


def test_a_queue_that_refills_within_idle_for_never_scales_down() -> None:
    # Bursts every 12 s: 4 s of backlog (every child busy), then 8 s idle, which is less
    # than idle_for. The count climbs to the maximum and stays there: no flapping.
    scaler = Autoscaler(1, 4, up_cooldown=2.0, down_cooldown=10.0, idle_for=15.0)
    current = 1
    idle_since: float | None = None
    history = []
    for step in range(100):
        now = step * 2.0
        bursting = now % 12.0 < 4.0
        if bursting:
            idle_since = None
            backlog, busy = 50, current
        else:
            idle_since = now if idle_since is None else idle_since
            backlog, busy = 0, 0
        longest_idle = 0.0 if idle_since is None else now - idle_since
        delta = scaler.decide(now, current, backlog, busy, longest_idle)
        assert delta >= 0, f"scaled down at {now} s after {longest_idle} s idle"
        current += delta
        history.append(current)
    assert history == sorted(history)
    assert history[-1] == 4


def test_a_queue_that_stays_empty_scales_down_step_by_step_to_the_minimum() -> None:
    scaler = Autoscaler(1, 4, down_cooldown=10.0, idle_for=15.0)
    current, changes = 4, []
    for step in range(200):
        now = step * 2.0  # idle since 0
        delta = scaler.decide(now, current, backlog=0, busy=0, longest_idle=now)
        if delta:
            changes.append((now, delta))
        current += delta
    assert current == 1
    assert changes == [(16.0, -1), (26.0, -1), (36.0, -1)]


@pytest.mark.parametrize(("low", "high"), [(0, 3), (3, 2), (-1, -1), (0, 0), (2, 1)])
def test_autoscaler_rejects_invalid_bounds(low: int, high: int) -> None:
    with pytest.raises(ValueError, match="MIN <= MAX"):
        Autoscaler(low, high)


def test_autoscaler_accepts_equal_bounds() -> None:
    scaler = Autoscaler(2, 2)
    assert scaler.decide(100.0, current=2, backlog=100, busy=2, longest_idle=0.0) == 0
    assert scaler.decide(200.0, current=2, backlog=0, busy=0, longest_idle=1e6) == 0


# -- describe_exit --------------------------------------------------------------------------


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


# -- Child.read and the report writers -----------------------------------------------------


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)  # as the arbiter does after the fork
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        try:
            os.close(fd)
        except OSError:
            pass


@pytest.fixture
def child(pipe: tuple[int, int]) -> Child:
    return Child(pid=4242, index=1, owner="host:4242:abc", pipe=pipe[0], started=0.0, last_seen=0.0)


def test_read_with_nothing_written_is_still_open(child: Child) -> None:
    assert child.read(1.0) is True
    assert child.jobs == {} and child.last_seen == 0.0


def test_heartbeats_set_rss_and_peak_rss(child: Child, pipe: tuple[int, int]) -> None:
    write_fd = pipe[1]
    Reporter(write_fd).heartbeat(1000)
    Reporter(write_fd).heartbeat(5000)
    Reporter(write_fd).heartbeat(3000)
    assert child.read(7.0) is True
    assert (child.rss, child.peak_rss, child.last_seen) == (3000, 5000, 7.0)
    assert not child.busy


def test_start_and_end_track_jobs_busy_and_idle_since(child: Child, pipe: tuple[int, int]) -> None:
    write_fd = pipe[1]
    Reporter(write_fd).start(7, 1.5, "render")
    assert child.read(10.0)
    assert child.jobs == {7: RunningJob(7, "render", 10.0, 1.5)}
    assert child.busy and child.idle_since is None and child.last_seen == 10.0

    Reporter(write_fd).start(8, None, "send email")  # a second thread's job; spaces survive
    assert child.read(11.0)
    assert child.jobs[8] == RunningJob(8, "send email", 11.0, None)

    Reporter(write_fd).end(7)
    assert child.read(12.0)
    assert list(child.jobs) == [8]
    assert child.busy and child.idle_since is None  # still running job 8

    Reporter(write_fd).end(8)
    assert child.read(13.0)
    assert child.jobs == {} and not child.busy and child.idle_since == 13.0


def test_a_long_task_name_is_cut_to_200_characters(child: Child, pipe: tuple[int, int]) -> None:
    Reporter(pipe[1]).start(1, 2, "t" * 5000)
    assert child.read(1.0)
    assert child.jobs[1].task == "t" * 200
    assert child.jobs[1].timeout == 2.0


def test_partial_lines_are_reassembled(child: Child, pipe: tuple[int, int]) -> None:
    write_fd = pipe[1]
    os.write(write_fd, b"H 12")
    assert child.read(1.0)
    assert child.rss == 0 and child.last_seen == 0.0  # nothing applied from half a line
    os.write(write_fd, b"34\nS 9 2.5 ta")
    assert child.read(2.0)
    assert child.rss == 1234 and child.jobs == {}
    os.write(write_fd, b"sk")
    assert child.read(3.0)
    assert child.jobs == {}
    os.write(write_fd, b"\nE 9\nH 7")
    assert child.read(4.0)
    assert child.jobs == {} and child.idle_since == 4.0 and child.rss == 1234
    os.write(write_fd, b"\n")
    assert child.read(5.0)
    assert child.rss == 7 and child.peak_rss == 1234


def test_a_line_split_inside_a_multibyte_character_survives(
    child: Child, pipe: tuple[int, int]
) -> None:
    line = "S 3 - café\n".encode()
    cut = line.index("é".encode()) + 1  # between the two bytes of é
    os.write(pipe[1], line[:cut])
    assert child.read(1.0)
    os.write(pipe[1], line[cut:])
    assert child.read(2.0)
    assert child.jobs[3].task == "café"


def test_many_reports_in_one_read(child: Child, pipe: tuple[int, int]) -> None:
    write_fd = pipe[1]
    for i in range(1, 2001):
        Reporter(write_fd).start(i, None, "noop")
        Reporter(write_fd).heartbeat(i)
        Reporter(write_fd).end(i)
    assert child.read(1.0)
    assert child.jobs == {} and child.rss == 2000 and child.peak_rss == 2000


def test_read_returns_false_once_the_write_end_closes(child: Child, pipe: tuple[int, int]) -> None:
    write_fd = pipe[1]
    Reporter(write_fd).start(5, None, "last words")
    os.close(write_fd)
    # What the child wrote before it died is still applied (reap reads once more).
    assert child.read(9.0) is False
    assert 5 in child.jobs
    assert child.read(10.0) is False


def test_read_after_close_returns_false(child: Child) -> None:
    child.close()
    assert child.read(1.0) is False
    child.close()  # closing twice is harmless


def test_report_writers_never_raise_once_the_parent_is_gone(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    os.close(read_fd)
    Reporter(write_fd).heartbeat(1)  # EPIPE, swallowed
    Reporter(write_fd).start(1, None, "x")
    Reporter(write_fd).end(1)
    os.close(write_fd)
    Reporter(write_fd).heartbeat(1)  # EBADF, swallowed


def test_overdue_respects_the_timeout() -> None:
    job = RunningJob(1, "render", started=100.0, timeout=2.0)
    assert not job.overdue(101.0)
    assert not job.overdue(102.0)  # exactly at the timeout is not yet overdue
    assert job.overdue(102.01)


def test_a_job_without_a_timeout_is_never_overdue() -> None:
    job = RunningJob(1, "render", started=100.0, timeout=None)
    assert not job.overdue(1e12)


# -- SupervisorConfig -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workers": 0}, "workers must be >= 1"),
        ({"workers": -3}, "workers must be >= 1"),
        ({"max_jobs_per_child": 0}, "max_jobs_per_child"),
        ({"max_memory_per_child": 0.0}, "max_memory_per_child"),
        ({"max_memory_per_child": -5.0}, "max_memory_per_child"),
        ({"autoscale": (0, 3)}, "MIN <= MAX"),
        ({"autoscale": (4, 2)}, "MIN <= MAX"),
        ({"autoscale": (0, 0)}, "MIN <= MAX"),
    ],
)
def test_config_rejects_nonsense(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SupervisorConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("child_timeout", [0.0, -1.0])
def test_config_rejects_a_child_timeout_that_would_kill_every_child(child_timeout: float) -> None:
    # Children report every 0.5 s; a child_timeout of 0 makes kill_unresponsive SIGKILL
    # every child on the tick it starts (silent > 0), a crash loop with nothing crashing.
    with pytest.raises(ValueError, match="child_timeout"):
        SupervisorConfig(workers=1, child_timeout=child_timeout)


def test_config_rejects_a_negative_kill_grace() -> None:
    with pytest.raises(ValueError, match="kill_grace"):
        SupervisorConfig(workers=1, kill_grace=-1.0)


def test_config_accepts_sensible_settings() -> None:
    cfg = SupervisorConfig(
        workers=1, max_jobs_per_child=1, max_memory_per_child=0.5, autoscale=(2, 2)
    )
    assert cfg.autoscale == (2, 2)
    assert SupervisorConfig().workers >= 1  # the CPU count


def test_shutdown_budget_is_grace_plus_kill_grace_plus_a_margin() -> None:
    cfg = SupervisorConfig(workers=1, worker=WorkerConfig(grace=7.5), kill_grace=1.25)
    assert cfg.shutdown_budget == 7.5 + 1.25 + 2.0
    assert SupervisorConfig(workers=1).shutdown_budget == 30.0 + 3.0 + 2.0
    zero = SupervisorConfig(workers=1, worker=WorkerConfig(grace=0.0), kill_grace=0.0)
    assert zero.shutdown_budget == 2.0
