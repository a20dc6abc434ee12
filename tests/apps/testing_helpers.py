"""A test app for forklift.testing's helpers: an app's tasks as its own tests would meet
them. Its DSN and schema are set per test (tests/integration/test_testing_helpers.py);
effects go to the `effects` table the `schema` fixture makes."""

from __future__ import annotations

import asyncio

import forklift

app = forklift.App()

# Long enough that a retry never falls due during a test on its own: a drain runs it
# again only when told to (with_scheduled).
LATER = forklift.Backoff(base=600.0, jitter=0.0)


@app.task
def charge(ctx: forklift.JobContext, *, account: str, cents: int) -> dict[str, object]:
    """Write an effect row in the job's effect transaction; return a receipt."""
    with ctx.transaction() as conn:
        conn.execute(
            f"INSERT INTO {app.schema}.effects (job_id, key, n) VALUES (%s, %s, %s)",
            (ctx.job_id, account, cents),
        )
    return {"account": account, "cents": cents, "attempt": ctx.attempt}


@app.task(max_attempts=2, backoff=LATER)
def charge_then_fail(ctx: forklift.JobContext, *, account: str) -> None:
    """Write an effect row, then raise: the effect must roll back with the failure."""
    with ctx.transaction() as conn:
        conn.execute(
            f"INSERT INTO {app.schema}.effects (job_id, key, n) VALUES (%s, %s, 1)",
            (ctx.job_id, account),
        )
    raise RuntimeError(f"card declined for {account}")


@app.task(max_attempts=2, backoff=LATER)
def flaky(ctx: forklift.JobContext, *, key: str) -> str:
    """Fail on the first attempt, succeed on the second."""
    if ctx.attempt == 1:
        raise ConnectionError("the card network is away")
    return f"{key} on attempt {ctx.attempt}"


@app.task
def refuse(ctx: forklift.JobContext, *, reason: str) -> None:
    """Give up at once: dead on its first attempt."""
    raise forklift.Fail(reason)


@app.task
def pair(ctx: forklift.JobContext, *, a: int, b: int) -> tuple[int, int]:
    """Return a tuple: stored as JSON, it comes back a list."""
    return (a, b)


@app.task
def fan_out(ctx: forklift.JobContext, *, accounts: list[str]) -> int:
    """Enqueue one charge per account (jobs a handler enqueues)."""
    for account in accounts:
        charge.enqueue(account=account, cents=len(account))
    return len(accounts)


@app.task
def linger(ctx: forklift.JobContext, *, seconds: float) -> bool:
    """Wait `seconds`, returning at once when told to stop (ctx.cancelled)."""
    return ctx.wait_cancelled(seconds)


@app.task(queue="reports")
def report(ctx: forklift.JobContext, *, day: str) -> str:
    return f"report for {day}"


@app.task
async def a_charge(ctx: forklift.AsyncJobContext, *, account: str, cents: int) -> int:
    """charge, as an async def: its effect on an AsyncConnection."""
    await asyncio.sleep(0)
    async with ctx.transaction() as conn:
        await conn.execute(
            f"INSERT INTO {app.schema}.effects (job_id, key, n) VALUES (%s, %s, %s)",
            (ctx.job_id, account, cents),
        )
    return cents


@app.task
def resumable(ctx: forklift.JobContext, *, rows: int) -> dict[str, object]:
    """A resumable handler: a step, a loop writing a row per item, a checkpoint."""
    where = ctx.step("locate", lambda: "s3://bucket/key")
    for n in ctx.iterate(range(rows)):
        with ctx.transaction() as conn:
            conn.execute(
                f"INSERT INTO {app.schema}.effects (job_id, key, n) VALUES (%s, %s, %s)",
                (ctx.job_id, where, n),
            )
    ctx.checkpoint({"phase": "done"}, flush=True)
    return {"where": where, "checkpointed": ctx.checkpointed}
