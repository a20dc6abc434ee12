"""The demo's app: one job per tile of a Mandelbrot image, all of them one batch, and the
batch's callback that assembles the image from the tiles, once.

`forklift demo` runs it with `forklift run forklift.demo.mandelbrot:app`; the database
and schema come from FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA. It lives in the package
so the demo works from an installed wheel, not only from a checkout.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import forklift
from forklift import _sql
from forklift.demo.assembly import assemble as assemble_image
from forklift.demo.fractal import Tile, render

TASK = "render_tile"
ASSEMBLE = "assemble"

app = forklift.App()


def job_args(tile: Tile, width: int, height: int) -> dict[str, int]:
    """The keyword arguments of the render_tile job for `tile`."""
    return dict(tile=tile.index, x=tile.x, y=tile.y, w=tile.w, h=tile.h, width=width, height=height)


@app.task(name=TASK, max_attempts=3, timeout=60.0, backoff=forklift.Backoff(base=0.2))
def render_tile(
    ctx: forklift.JobContext, *, tile: int, x: int, y: int, w: int, h: int, width: int, height: int
) -> None:
    """Render one tile, then store it in the job's completion transaction: the tile row
    commits exactly when the job does, so a retried job never leaves two."""
    pixels = render(Tile(tile, x, y, w, h), width, height)
    with ctx.transaction() as conn:
        conn.execute(
            _sql.load("forklift.demo", "queries.sql", app.schema)["tile_insert"],
            {"tile": tile, "worker_pid": os.getpid(), "attempt": ctx.attempt, "pixels": pixels},
        )


@app.task(name=ASSEMBLE, max_attempts=3, timeout=60.0, backoff=forklift.Backoff(base=0.2))
def assemble(ctx: forklift.JobContext, *, out: str, width: int, height: int) -> dict[str, Any]:
    """The tile batch's callback (on_complete): read every tile back, write the image
    with its caption to `out`, and record the run in the job's completion transaction,
    so the demo can count that it committed once. Returns what it wrote."""
    batch = ctx.batch
    if batch is None:
        raise ValueError(f"{ASSEMBLE} runs as a batch's on_complete callback, not on its own")
    ctx.progress(0, 1, "assembling the image")
    with ctx.transaction() as conn:
        status = batch.status(conn)
        made = assemble_image(conn, app.schema, status, ctx.attempt, Path(out), (width, height))
    ctx.progress(1, 1, f"wrote {out}")
    return made
