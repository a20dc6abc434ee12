"""How a child died, in words an operator can act on."""

from __future__ import annotations

import os
import signal

_LIKELY: dict[int, str] = {
    signal.SIGKILL.value: "possibly out of memory (kernel OOM killer) or killed by an operator",
    signal.SIGSEGV.value: "segmentation fault, usually in native code",
    signal.SIGBUS.value: "bus error, usually in native code",
    signal.SIGABRT.value: "aborted, usually by native code",
    signal.SIGFPE.value: "arithmetic fault in native code",
    signal.SIGILL.value: "illegal instruction in native code",
    signal.SIGTERM.value: "terminated by someone other than this supervisor",
}


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(status: int, peak_rss_bytes: int | None = None, cause: str | None = None) -> str:
    """Turn a waitpid status into e.g. 'killed by SIGKILL: possibly out of memory ...'.

    `cause` is what the supervisor itself knows (it killed the child for a reason).
    """
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        text = f"WorkerDied: worker process killed by {signal_name(signum)}"
        reason = cause or _LIKELY.get(signum)
        if reason:
            text += f": {reason}"
    elif os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        text = f"WorkerDied: worker process exited with code {code}"
        if cause:
            text += f": {cause}"
    else:
        text = f"WorkerDied: worker process ended with status {status}"
    if peak_rss_bytes:
        text += f" (peak RSS {peak_rss_bytes / 2**20:.0f} MiB)"
    return text
