"""The apps of bench.interactions: what users combine, each handler keeping a diary.

Workers load `bench.interactions_app:app` (the current version) or `:app_v2` (a second
version of the same code, deployed mid-run, that declares the limits differently). DSN
and schema come from FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA, the diary's path from
$INTERACTIONS_DIARY; the repository root must be on PYTHONPATH.

The diary is the handlers' side of the story, one line per event, appended to a file
(O_APPEND, one write a line: lines of many processes and threads never interleave):

    start <job> <attempt> <pid> <time> <task> <key>
    beat  <job> <attempt> <pid> <time> <task> <key>   (every BEAT s while a handler waits)
    stop  <job> <attempt> <pid> <time> <task> <key>   (as the handler returns)
    raise <job> <attempt> <pid> <time> <task> <key>   (as it raises instead)

`time` is time.time(), one clock for every process on the machine. A file, not a table:
a handler's own insert would fail during the very outages and backend kills the bench
injects (or ride the effect transaction, and vanish with it), and the diary must say
what ran whatever the database did. A handler with a start and no stop was still
running when its process died; its beats bound from below how long it ran. The handlers
raise only when the database fails them (or, poison, never return).

Each job's effect is one row of `<schema>.effects` (no unique key: a second commit shows
as a second row), written in ctx.transaction(), so it commits exactly when the job does.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import forklift
from forklift import Limit

DIARY_ENV = "INTERACTIONS_DIARY"
BEAT = 0.2  # seconds between a waiting handler's beats
# Short backoffs: the run has minutes, not hours, for the retries of a job.
QUICK = forklift.Backoff(base=0.2, factor=2.0, max=2.0, jitter=0.0)
KEYED_TIMEOUT = 2.0  # seconds a `keyed` handler may run
# Progress messages users' code really sends: a NUL, a lone surrogate (a file name read
# with surrogateescape), bidi overrides, a huge one, control characters.
HOSTILE = ("bad\x00byte", "name-\udcff.txt", "\u202egnp.exe\u202c", "x" * 5000, "\x1b[2J\r\n")


def note(event: str, job: int, attempt: int, task: str, key: object) -> None:
    """Append one diary line (see the module's docstring)."""
    line = f"{event} {job} {attempt} {os.getpid()} {time.time()!r} {task} {key}\n"
    fd = os.open(os.environ[DIARY_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


class Diary:
    """`with Diary(ctx, key):` a start line now, a stop line when the block ends."""

    def __init__(self, ctx: forklift.JobContext | forklift.AsyncJobContext, key: object) -> None:
        self.job, self.attempt, self.task, self.key = ctx.job_id, ctx.attempt, ctx.task, key

    def __enter__(self) -> Diary:
        note("start", self.job, self.attempt, self.task, self.key)
        return self

    def beat(self) -> None:
        note("beat", self.job, self.attempt, self.task, self.key)

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        note("stop" if kind is None else "raise", self.job, self.attempt, self.task, self.key)


def effect_sql(schema: str) -> str:
    return (
        f'INSERT INTO "{schema}".effects (job_id, attempt, task, batch_id, note)'
        " VALUES (%s, %s, %s, %s, %s)"
    )


class Handlers:
    """The bench's handlers, writing their effects into one schema; `build` declares them
    as tasks, with options of the version it builds."""

    def __init__(self, schema: str) -> None:
        self.insert = effect_sql(schema)

    def effect(self, ctx: forklift.JobContext, batch_id: int | None = None, text: str = "") -> None:
        with ctx.transaction() as conn:
            conn.execute(self.insert, (ctx.job_id, ctx.attempt, ctx.task, batch_id, text))

    def plain(self, ctx: forklift.JobContext, *, key: str, pause: float = 0.0) -> str:
        """An ordinary job: a little wait, its effect; its key is its result."""
        with Diary(ctx, key):
            time.sleep(pause)
            self.effect(ctx)
            return key

    async def aplain(self, ctx: forklift.AsyncJobContext, *, key: str, pause: float = 0.0) -> str:
        """The same, as an async handler on the worker's event loop."""
        with Diary(ctx, key):
            await asyncio.sleep(pause)
            async with ctx.transaction() as conn:
                await conn.execute(self.insert, (ctx.job_id, ctx.attempt, ctx.task, None, ""))
            return key

    def poison(self, ctx: forklift.JobContext, *, key: str) -> None:
        """Kill the worker process, every time: it must end dead, alone. It dies a
        moment into its run, as a crash mid-work does: handlers started with it in the
        same instant have written their start lines by then (a handler's start is seen
        only once its first line is written, and the GIL is free while it writes)."""
        with Diary(ctx, key):
            time.sleep(0.05)
            os._exit(7)

    def chatty(self, ctx: forklift.JobContext, *, key: str, which: int = 0) -> None:
        """Report progress with hostile text, then the effect. A message refused by
        ctx.progress is fine (text that cannot be stored is refused there); the job goes on. Half of
        them return at once, so that their last progress rides their completion (a
        group commit with other jobs'), the other half wait past the worker's
        half-second progress write."""
        with Diary(ctx, key):
            try:
                ctx.progress(1, 2, HOSTILE[which % len(HOSTILE)])
            except (ValueError, TypeError, forklift.ArgumentError):
                pass
            if which % 2:
                time.sleep(0.6)
            self.effect(ctx)

    def keyed(
        self, ctx: forklift.JobContext, *, account: int, seconds: float, stubborn: bool
    ) -> None:
        """Under a per-account limit: wait `seconds` (past the timeout, now and then),
        beating; a `stubborn` one ignores ctx.cancelled, as much code does."""
        with Diary(ctx, account) as diary:
            deadline = time.monotonic() + seconds
            while (left := deadline - time.monotonic()) > 0:
                if not stubborn and ctx.cancelled:
                    return
                time.sleep(min(BEAT, left))
                diary.beat()
            self.effect(ctx)

    def metered(self, ctx: forklift.JobContext, *, key: str) -> None:
        """Under a rate limit: just the effect."""
        with Diary(ctx, key):
            self.effect(ctx)

    def member(self, ctx: forklift.JobContext, *, key: str, pause: float = 0.0) -> str:
        """A batch's job: its key is its result, which the callback and waiters read."""
        with Diary(ctx, key):
            time.sleep(pause)
            self.effect(ctx, ctx.job.batch_id)
            return key

    def gather(self, ctx: forklift.JobContext, *, tag: str) -> dict[str, Any]:
        """A batch's callback: its effect names the batch it finishes (exactly one per
        batch is the check), and says what it could read of the batch."""
        with Diary(ctx, tag):
            batch = ctx.batch
            assert batch is not None, "a callback without its batch"
            try:
                status = batch.status()
                seen = (
                    f"total={status.total} succeeded={status.succeeded} dead={status.dead} "
                    f"cancelled={status.cancelled} outcome={status.outcome} "
                    f"results={len(batch.results())}"
                )
            except forklift.ForkliftError as exc:
                seen = f"{type(exc).__name__}: {exc}"
            self.effect(ctx, batch.id, seen)
            return {"batch": batch.id, "seen": seen}


def build(app: forklift.App, keyed_limit: Limit | None, metered_limit: Limit) -> forklift.App:
    """Register the bench's tasks on `app` with these two limits; return it."""
    h = Handlers(app.schema)
    app.task(name="plain", max_attempts=8, backoff=QUICK)(h.plain)
    app.task(name="aplain", max_attempts=8, backoff=QUICK)(h.aplain)
    app.task(name="poison", max_attempts=2, backoff=QUICK)(h.poison)
    app.task(name="chatty", max_attempts=8, backoff=QUICK)(h.chatty)
    app.task(name="keyed", max_attempts=3, backoff=QUICK, timeout=KEYED_TIMEOUT, limit=keyed_limit)(
        h.keyed
    )
    app.task(name="metered", max_attempts=8, backoff=QUICK, limit=metered_limit)(h.metered)
    app.task(name="member", max_attempts=8, backoff=QUICK)(h.member)
    app.task(name="gather", max_attempts=8, backoff=QUICK)(h.gather)
    return app


TASKS: tuple[str, ...] = (
    "plain", "aplain", "poison", "chatty", "keyed", "metered", "member", "gather"
)  # fmt: skip
# The current version: one handler per account at a time, 20 metered starts a second.
KEYED = Limit(concurrency=1, key="account")
METERED = Limit(rate=20, per=1.0)
# The second version, rolled out beside it: `keyed` declared with no limit (its limit
# came in the current version, which this one predates), `metered` over a longer window.
METERED_V2 = Limit(rate=40, per=2.0)

Register = Callable[[forklift.App], forklift.App]


def current(app: forklift.App) -> forklift.App:
    return build(app, KEYED, METERED)


def second(app: forklift.App) -> forklift.App:
    return build(app, None, METERED_V2)


app = current(forklift.App())
app_v2 = second(forklift.App())
