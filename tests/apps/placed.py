"""A test app of worker labels and job cost (tests/acceptance/test_placement_cli.py): its
DSN and schema come from FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA."""

from __future__ import annotations

import forklift

app = forklift.App()


@app.task(requires={"gpu"})
def render(ctx: forklift.JobContext) -> None:
    pass


@app.task
def plain(ctx: forklift.JobContext) -> None:
    pass


@app.task(cost=2, queue="big")
def heavy(ctx: forklift.JobContext) -> None:
    pass
