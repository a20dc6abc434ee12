"""The batch's callback at work: every tile effect read back from the database and put
together into one PNG, with a caption strip saying who rendered what (the fan-in)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from forklift import _sql
from forklift.batch import BatchStatus
from forklift.demo.caption import BAD, GOOD, Item, Line, strip
from forklift.demo.fractal import tiles
from forklift.demo.image import MISSING, RGB, RenderedTile, colours, compose
from forklift.demo.png import write_png

RETRIES_SHOWN = 3  # failed attempts told one by one in the caption; the rest summed up


def owner_pid(owner: str) -> int | None:
    """The pid in a lease owner id (host:pid:nonce), None if it has none."""
    parts = owner.rsplit(":", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


@dataclass(frozen=True)
class Retried:
    """A failed attempt at a tile: whose, its error, and who rendered the tile in the end."""

    tile: int
    failed_pid: int | None
    error: str
    final_pid: int | None  # None: no attempt committed

    def text(self) -> str:
        who = f"worker {self.failed_pid}" if self.failed_pid is not None else "a worker"
        how = "killed" if "killed by SIG" in self.error else f"failed ({_kind(self.error)})"
        then = "rendered again" if self.final_pid is not None else "never rendered"
        return f"{who} {how} at tile {self.tile}, {then}"


def _kind(error: str) -> str:
    """'LeaseExpired' of 'LeaseExpired: lease of ... expired'."""
    return error.partition(":")[0] or "no error recorded"


@dataclass(frozen=True)
class Facts:
    """What the callback read of its batch: the tile effects, who failed where, its end."""

    status: BatchStatus
    rendered: list[RenderedTile]
    by_worker: dict[int, int]
    retried: list[Retried]
    effect_rows: int
    effect_tiles: int
    earlier_runs: int  # committed runs of this callback before this one: none, ever

    @classmethod
    def read(cls, conn: psycopg.Connection[Any], schema: str, status: BatchStatus) -> Facts:
        queries = _sql.load("forklift.demo", "queries.sql", schema)

        def rows(name: str, **params: Any) -> list[tuple[Any, ...]]:
            return conn.execute(queries[name], params or None).fetchall()

        [(effect_rows, effect_tiles)] = rows("tile_effect_counts")
        return cls(
            status=status,
            rendered=[RenderedTile(*r) for r in rows("tile_all")],
            by_worker=dict(sorted(rows("tile_count_by_worker"))),
            retried=[
                Retried(tile, owner_pid(owner), error, final)
                for tile, owner, error, final in rows("tile_retried", batch=status.id)
            ],
            effect_rows=effect_rows,
            effect_tiles=effect_tiles,
            earlier_runs=rows("image_count", batch=status.id)[0][0],
        )


def caption(facts: Facts, palette: dict[int, RGB], tiles: int, attempt: int) -> list[Line]:
    """The caption's lines: which tint is which worker and how many tiles each rendered,
    every tile rendered again (framed in red, in the tint of who rendered it in the end),
    and the verdict on the effects."""
    lines: list[Line] = [
        [Item(f"{tiles} tiles, tinted by the worker that rendered each:")],
        [
            Item(f"worker {pid}: {_tiles(n)}", swatch=palette[pid])
            for pid, n in facts.by_worker.items()
        ],
    ]
    for r in facts.retried[:RETRIES_SHOWN]:
        final = MISSING if r.final_pid is None else palette.get(r.final_pid, MISSING)
        lines.append([Item(r.text(), swatch=final, framed=True)])
    if len(facts.retried) > RETRIES_SHOWN:
        lines.append([Item(f"and {len(facts.retried) - RETRIES_SHOWN} more failed attempts")])
    lost = facts.status.dead + facts.status.cancelled
    if lost:
        lines.append([Item(f"{_tiles(lost)} not rendered: {facts.status.dead} dead, "
                           f"{facts.status.cancelled} cancelled", BAD)])  # fmt: skip
    once = facts.effect_rows == facts.effect_tiles == tiles and facts.earlier_runs == 0
    lines.append(
        [Item(f"{_effects(facts, tiles)}, {_runs(facts, attempt)}", GOOD if once else BAD)]
    )
    return lines


def _tiles(n: int) -> str:
    return f"{n} tile" if n == 1 else f"{n} tiles"


def _effects(facts: Facts, tiles: int) -> str:
    text = f"{facts.effect_rows} effects for {tiles} tiles"
    if facts.effect_tiles != facts.effect_rows:
        text += f" ({facts.effect_tiles} distinct)"
    return text


def _runs(facts: Facts, attempt: int) -> str:
    if facts.earlier_runs:
        return f"callback ran {facts.earlier_runs + 1} times"
    return "callback ran once" if attempt == 1 else f"callback ran once, on attempt {attempt}"


def assemble(
    conn: psycopg.Connection[Any],
    schema: str,
    status: BatchStatus,
    attempt: int,
    out: Path,
    size: tuple[int, int],
) -> dict[str, Any]:
    """Read the batch's tiles on `conn` (the callback's effect transaction), write the
    image with its caption to `out`, record this run there; what it made, for the result.

    The file is written before the run's row commits: an attempt that dies before its
    commit leaves a whole file (written by rename) that the next attempt writes again.
    """
    width, height = size
    facts = Facts.read(conn, schema, status)
    layout = tiles(width, height)
    palette = colours(facts.by_worker)
    image = compose(width, height, layout, facts.rendered, palette)
    strip_height, strip_pixels = strip(width, caption(facts, palette, len(layout), attempt))
    write_png(out, width, height + strip_height, image + strip_pixels)
    queries = _sql.load("forklift.demo", "queries.sql", schema)
    conn.execute(
        queries["image_insert"],
        {"batch": status.id, "worker_pid": os.getpid(), "attempt": attempt, "path": str(out)},
    )
    return {
        "path": str(out),
        "width": width,
        "height": height + strip_height,
        "caption_height": strip_height,
        "worker_pid": os.getpid(),
        "palette": {str(pid): list(colour) for pid, colour in palette.items()},
    }
