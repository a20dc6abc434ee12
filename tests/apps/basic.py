"""A test app: its DSN and schema come from FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA."""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import stat
import time

import forklift

app = forklift.App()
SCHEMA = app.schema


@app.task(name="noop")
def noop(ctx: forklift.JobContext) -> None:
    pass


@app.task(name="effect")
def effect(ctx: forklift.JobContext, *, key: str, n: int = 0, sleep: float = 0.0) -> None:
    """Insert one effect row per run; the unique key exposes any double commit. A run
    that sleeps first reports progress as its handler starts (a test may wait for it)."""
    if sleep:
        ctx.progress(0, message="started")
        time.sleep(sleep)
    with ctx.transaction() as conn:
        conn.execute(
            f"INSERT INTO {SCHEMA}.effects (job_id, key, n) VALUES (%s, %s, %s)",
            (ctx.job_id, key, n),
        )


@app.task(name="hold", max_attempts=1)
def hold(ctx: forklift.JobContext, *, key: str, seconds: float) -> None:
    """Open the effect transaction first, then work in it (idle, as far as the server
    sees) for `seconds`; record what the server would allow."""
    with ctx.transaction() as conn:
        row = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
        assert row is not None
        conn.execute(
            f"INSERT INTO {SCHEMA}.effects (job_id, key) VALUES (%s, %s)", (ctx.job_id, row[0])
        )
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            sum(range(10_000))


@app.task(name="hold_timed", max_attempts=1, timeout=40.0)
def hold_timed(ctx: forklift.JobContext, *, key: str, seconds: float) -> None:
    """`hold`, for a task that says how long it may take."""
    hold.fn(ctx, key=key, seconds=seconds)


@app.task(name="fork_and_spin", max_attempts=1, timeout=1.0)
def fork_and_spin(ctx: forklift.JobContext, *, pidfile: str) -> None:
    """Open the effect transaction, fork a grandchild that keeps the connection's socket
    open (as a handler that spawns helpers without closing descriptors would), then
    spin past the timeout: killing this worker does not close that session."""
    with ctx.transaction() as conn:
        conn.execute(f"INSERT INTO {SCHEMA}.effects (job_id) VALUES (%s)", (ctx.job_id,))
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        with open(pidfile, "w") as f:
            f.write(str(pid))
        while True:
            sum(range(1000))


@app.task(name="sleep")
def sleep(ctx: forklift.JobContext, *, seconds: float) -> None:
    """Sleep, waking at once when told to stop."""
    ctx.wait_cancelled(seconds)


@app.task(name="poll")
def poll(ctx: forklift.JobContext, *, seconds: float) -> None:
    """Work in small steps, checking ctx.cancelled (a bool) between them."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not ctx.cancelled:
        time.sleep(0.01)


@app.task(name="fail", max_attempts=3, backoff=forklift.Backoff(base=0.05, jitter=0.0))
def fail(ctx: forklift.JobContext, *, message: str = "boom") -> None:
    raise RuntimeError(message)


@app.task(name="give_up")
def give_up(ctx: forklift.JobContext) -> None:
    raise forklift.Fail("not worth retrying")


@app.task(name="retry_later", max_attempts=2)
def retry_later(ctx: forklift.JobContext, *, retry_in: float) -> None:
    raise forklift.Retry("try again", delay=retry_in)


@app.task(name="retry_after", max_attempts=2)
def retry_after(ctx: forklift.JobContext, *, run: float, retry_in: float) -> None:
    """Run `run` seconds (the worker's claim loop is asleep by then), then ask for a
    retry in `retry_in` seconds."""
    time.sleep(run)
    raise forklift.Retry("try again", delay=retry_in)


@app.task(name="exit", max_attempts=3)
def exit_process(ctx: forklift.JobContext, *, code: int = 3) -> None:
    os._exit(code)


@app.task(name="spin", timeout=1.0, max_attempts=2)
def spin(ctx: forklift.JobContext) -> None:
    """Burn CPU forever, ignoring ctx.cancelled: only the supervisor can end it."""
    while True:
        sum(range(1000))


@app.task(name="hog", max_attempts=2)
def hog(ctx: forklift.JobContext, *, mib_per_step: int = 20) -> None:
    """Leak memory steadily (as a real leak would) until something stops it."""
    leak: list[bytes] = []
    while True:
        leak.append(b"x" * (mib_per_step * 2**20))  # written, so resident
        time.sleep(0.05)


@app.task(name="wedge")
def wedge(ctx: forklift.JobContext) -> None:
    """Hold the GIL in native code for ages (catastrophic regex backtracking)."""
    re.match(r"(a+)+$", "a" * 64 + "b")


SCRIBBLES = [
    b"metrics " + b"[" * 100_000 + b"\n",  # nested past the parser's stack
    b'{"k": "metrics", "deltas": {"jobs": [["q", "t", "succeeded", 1e400]]}}\n',
    bytes(range(256)) * 64,  # binary, newlines and all
    b"x" * (3 << 20) + b"\n",  # one 3 MiB line
    b'{"k": "heartbeat", "rss": -1}\n',
]


@app.task(name="scribble", max_attempts=1)
def scribble(ctx: forklift.JobContext) -> None:
    """Write garbage into every pipe this process may write to: its report pipe is one."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                continue
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_WRONLY:
                continue
            for garbage in SCRIBBLES:
                view = memoryview(garbage)
                while view:
                    view = view[os.write(fd, view) :]
        except OSError:
            continue  # gone, or a non-blocking pipe that is full


@app.task(name="backtrack", max_attempts=2, timeout=1.0)
def backtrack(ctx: forklift.JobContext, *, n: int = 32) -> None:
    """A regex that backtracks for minutes inside the C engine, holding the GIL: nothing
    else in its process runs (no lease renewal, no liveness retake) until it is killed."""
    re.fullmatch(r"(a+)+b", "a" * n)


@app.task(name="square")
def square(ctx: forklift.JobContext, *, n: int, effect: bool = False, sleep: float = 0.0) -> int:
    """Return n * n (its result); with `effect`, also an effect row in the same commit."""
    if sleep:
        time.sleep(sleep)
    if effect:
        with ctx.transaction() as conn:
            conn.execute(
                f"INSERT INTO {SCHEMA}.effects (job_id, key, n) VALUES (%s, %s, %s)",
                (ctx.job_id, f"square-{n}", n),
            )
    return n * n


@app.task(name="unstorable", max_attempts=3)
def unstorable(ctx: forklift.JobContext, *, size: int = 0) -> object:
    """Return what no result column takes: a set, or a string of `size` bytes."""
    return "x" * size if size else {1, 2}


@app.task(name="report", max_attempts=1)
def report(ctx: forklift.JobContext, *, steps: int, seconds: float = 0.0) -> None:
    """Report progress `steps` times over `seconds`."""
    for i in range(1, steps + 1):
        ctx.progress(i, steps, f"step {i}")
        if seconds:
            time.sleep(seconds / steps)


HOSTILE_PROGRESS = {"nul": "bad\x00", "surrogate": "é\udcff"}  # what jsonb cannot hold


@app.task(name="progress_says")
def progress_says(ctx: forklift.JobContext, *, which: str) -> None:
    """Report progress with a message PostgreSQL cannot store as it is (HOSTILE_PROGRESS)."""
    ctx.progress(1, 2, HOSTILE_PROGRESS[which])


@app.task(name="assemble")
def assemble(ctx: forklift.JobContext, *, out: str = "") -> None:
    """A batch's callback: write one effect row per run with what it saw of its batch
    (key: the batch, n: its results' sum), in the same commit as its completion."""
    batch = ctx.batch
    assert batch is not None, "the callback has no batch"
    status = batch.status()
    results = batch.results()
    total = sum(v for v in results.values() if isinstance(v, int))
    with ctx.transaction() as conn:
        conn.execute(
            f"INSERT INTO {SCHEMA}.effects (job_id, key, n) VALUES (%s, %s, %s)",
            (ctx.job_id, f"batch-{batch.id}:{status.outcome}:{len(batch.dead())}:{out}", total),
        )


async def _never_awaited(key: str) -> None:  # what an async handler's body would be
    raise AssertionError(f"{key}: a coroutine of a sync handler ran")


@app.task(name="returns_coroutine")
def returns_coroutine(ctx: forklift.JobContext, *, key: str) -> object:
    """A plain def that hands back a coroutine: the worker must not call it done."""
    return _never_awaited(key)


# -- async handlers (workers/aio.py) -------------------------------------------------

# Async handlers running now, and the most at once (this process's, for in-process workers).
ASYNC_RUNNING = {"now": 0, "most": 0}


@app.task(name="a_effect")
async def a_effect(
    ctx: forklift.AsyncJobContext, *, key: str, sleep: float = 0.0, fail_first: bool = False
) -> dict[str, object]:
    """Sleep on the loop, write one effect row in the async effect transaction; with
    `fail_first`, raise after the write on the first attempt (its effect rolls back)."""
    ASYNC_RUNNING["now"] += 1
    ASYNC_RUNNING["most"] = max(ASYNC_RUNNING["most"], ASYNC_RUNNING["now"])
    try:
        await asyncio.sleep(sleep)
        async with ctx.transaction() as conn:
            await conn.execute(
                f"INSERT INTO {SCHEMA}.effects (job_id, key, n) VALUES (%s, %s, %s)",
                (ctx.job_id, key, ctx.attempt),
            )
        if fail_first and ctx.attempt == 1:
            raise RuntimeError("the first attempt fails after its effect")
        return {"key": key, "attempt": ctx.attempt}
    finally:
        ASYNC_RUNNING["now"] -= 1


@app.task(name="a_sleep", max_attempts=1, timeout=0.5)
async def a_sleep(ctx: forklift.AsyncJobContext, *, seconds: float) -> None:
    """Await past its timeout: cancelled by the loop at 0.5 s."""
    await asyncio.sleep(seconds)


@app.task(name="a_swallow", max_attempts=1, timeout=0.5)
async def a_swallow(ctx: forklift.AsyncJobContext, *, key: str, then: str = "return") -> str:
    """Swallow its timeout's CancelledError, write an effect, then return (or, `then` =
    "raise", raise a RuntimeError): past its deadline, the attempt must still end in a
    TimeoutError with that effect rolled back."""
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        pass
    async with ctx.transaction() as conn:
        await conn.execute(
            f"INSERT INTO {SCHEMA}.effects (job_id, key, n) VALUES (%s, %s, %s)",
            (ctx.job_id, key, ctx.attempt),
        )
        if then == "raise":
            raise RuntimeError("not the timeout")
    return "outlived its timeout"


# What a_wait saw, in order (this process's, for in-process workers).
ASYNC_NOTES: list[str] = []


@app.task(name="a_wait", max_attempts=1)
async def a_wait(ctx: forklift.AsyncJobContext, *, key: str, heed: bool) -> None:
    """Wait for a cancel: with `heed`, in ctx.wait_cancelled (and note it woke); without,
    in a plain asyncio.sleep, which the loop's cancel interrupts (noted too)."""
    ASYNC_NOTES.append(f"{key}:started")
    if heed:
        woke = await ctx.wait_cancelled(60)
        ASYNC_NOTES.append(f"{key}:woke={woke}")
        return
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        ASYNC_NOTES.append(f"{key}:cancelled")
        raise
