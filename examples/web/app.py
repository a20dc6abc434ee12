"""The forklift app of the web example: its tables, and the task that renders a thumbnail.

The supervisor imports this module (`forklift run examples.web.app:app`), and so does the
web process (examples.web.server), which creates the tables and enqueues the jobs.
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg

import forklift

app = forklift.App()

MIN_SIZE, MAX_SIZE = 16, 256  # pixels a side; 256 renders in ~0.3 s
DEPTH = 64  # iterations per pixel at most: the CPU cost of a render

# The app's own tables, in the app's schema (checked by forklift: safe to quote in).
# thumbnails.job_id is NULL only inside the transaction that creates the row: it is set
# there, once the job is enqueued, before anything commits.
TABLES = """
CREATE TABLE IF NOT EXISTS "{schema}".thumbnails (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text NOT NULL,
    size       integer NOT NULL,
    job_id     bigint UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS "{schema}".thumbnail_renders (
    thumbnail_id    bigint PRIMARY KEY REFERENCES "{schema}".thumbnails (id),
    job_id          bigint NOT NULL,
    sha256          text NOT NULL,
    mean_brightness double precision NOT NULL,
    rendered_at     timestamptz NOT NULL DEFAULT now()
);
"""


def create_tables(conn: psycopg.Connection[Any]) -> None:
    """Create the example's tables if they are not there yet (in forklift's schema, which
    must exist: run app.migrate() first)."""
    conn.execute(TABLES.format(schema=app.schema))


def render(name: str, size: int) -> tuple[str, float]:
    """A fake thumbnail, `size` x `size`: a Julia set whose shape the name chooses, in pure
    Python so it takes a core. Returns its pixels' sha256 and mean brightness (0-255)."""
    seed = hashlib.sha256(name.encode()).digest()
    cr = -0.8 + seed[0] / 255 * 0.4
    ci = 0.156 + seed[1] / 255 * 0.2
    scale = 3.0 / size
    digest = hashlib.sha256()
    total = 0
    for y in range(size):
        row = bytearray(size)
        for x in range(size):
            zr, zi = x * scale - 1.5, y * scale - 1.5
            n = 0
            while n < DEPTH and zr * zr + zi * zi < 4.0:
                zr, zi = zr * zr - zi * zi + cr, 2 * zr * zi + ci
                n += 1
            row[x] = n * 255 // DEPTH
        total += sum(row)
        digest.update(row)
    return digest.hexdigest(), total / (size * size)


@app.task(max_attempts=3, timeout=30.0)
def render_thumbnail(
    ctx: forklift.JobContext, *, thumbnail_id: int, name: str, size: int
) -> dict[str, Any]:
    """Render, then store the render in the transaction that completes the job: a retry
    after a crash never stores it twice (and the primary key would refuse it if it did).
    The returned dict is the job's result, what GET /thumbnails/<id> shows."""
    sha256, mean = render(name, size)
    with ctx.transaction() as conn:
        conn.execute(
            f'INSERT INTO "{app.schema}".thumbnail_renders'
            " (thumbnail_id, job_id, sha256, mean_brightness) VALUES (%s, %s, %s, %s)",
            (thumbnail_id, ctx.job_id, sha256, mean),
        )
    return {"thumbnail_id": thumbnail_id, "size": size, "sha256": sha256, "mean": round(mean, 2)}
