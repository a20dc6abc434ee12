"""Where the demo runs (an embedded server, or a schema of its own) and what it reads there."""

from __future__ import annotations

import os
import secrets
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from forklift import _db, _sql
from forklift._ids import application_name
from forklift.app import App
from forklift.demo.interrupts import Interrupts
from forklift.embedded import EmbeddedPostgres
from forklift.errors import DatabaseError


@dataclass(frozen=True)
class Place:
    """The database the demo works in, its schema, and how to say where that is."""

    dsn: str
    schema: str
    where: str


def named_dsn(dsn: str | None) -> str | None:
    """--dsn, else FORKLIFT_DATABASE_URL, else DATABASE_URL; None: nobody named one."""
    return dsn or os.environ.get("FORKLIFT_DATABASE_URL") or os.environ.get("DATABASE_URL")


def open_place(dsn: str | None, stack: ExitStack, interrupts: Interrupts) -> Place:
    """A fresh, migrated schema with the demo's tables, in the named database or, when none
    is named, on an embedded server; `stack` drops it (and stops the server) at the end."""
    schema = f"forklift_demo_{secrets.token_hex(4)}"
    if dsn is None:
        server = EmbeddedPostgres(prefix="forklift-demo-pg-")
        stack.callback(interrupts.shield(server.stop))
        with interrupts.shielded():  # a server half started is one left running
            dsn = server.start()
        where = f"an embedded PostgreSQL in {conninfo_to_dict(dsn)['host']}, deleted afterwards"
    else:
        _db.probe(dsn, _db.Timeouts())  # one line saying where and why, if it cannot
        where = f"schema {schema} of {_db.redact(dsn)}, dropped afterwards"
    stack.callback(interrupts.shield(lambda: _drop(dsn, schema)))
    App(dsn, schema=schema).migrate()
    with DemoStore(dsn, schema) as store:
        store.run("tiles_create")
        store.run("images_create")
    return Place(dsn, schema, where)


def _drop(dsn: str, schema: str) -> None:
    with DemoStore(dsn, schema) as store:
        store.run("schema_drop")


def owner_pid(owner: str) -> int:
    """The pid in a lease owner id (host:pid:nonce)."""
    return int(owner.rsplit(":", 2)[1])


@dataclass(frozen=True)
class Running:
    """A job being rendered now: its id, tile and lease owner (host:pid:nonce)."""

    job_id: int
    tile: int
    owner: str

    @property
    def pid(self) -> int:
        return owner_pid(self.owner)


@dataclass(frozen=True)
class Charged:
    """A job with a failed attempt behind it (a worker died under it, say)."""

    tile: int
    attempts: int
    state: str
    error: str


@dataclass(frozen=True)
class Snapshot:
    """Everything the progress view shows, read in one go."""

    states: dict[str, int]
    by_worker: dict[int, int]
    running: list[Running]
    charged: list[Charged]
    rerendered: dict[int, tuple[int, int]]  # tile -> (worker pid, attempt)

    @property
    def finished(self) -> int:
        return sum(self.states.get(s, 0) for s in ("succeeded", "dead", "cancelled"))


class DemoStore:
    """The only caller of the demo's queries, on one autocommit connection."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.queries = _sql.load("forklift.demo", "queries.sql", schema)
        try:
            self.conn = _db.connect(dsn, _db.Timeouts(), application_name="forklift-demo")
        except psycopg.Error as exc:
            raise DatabaseError(f"cannot connect: {exc}") from exc

    def __enter__(self) -> DemoStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.close()

    def run(self, name: str, **params: Any) -> list[tuple[Any, ...]]:
        try:
            cur = self.conn.execute(self.queries[name], params or None)
            return cur.fetchall() if cur.description else []
        except psycopg.Error as exc:
            raise DatabaseError(f"{name}: {exc}") from exc

    def snapshot(self, batch_id: int) -> Snapshot:
        """Where the tiles of batch `batch_id` stand (its callback's job is not one)."""
        return Snapshot(
            states=dict(self.run("job_count_by_state", batch=batch_id)),
            by_worker=dict(self.run("tile_count_by_worker")),
            running=[Running(*r) for r in self.run("job_running", batch=batch_id)],
            charged=[Charged(*r) for r in self.run("job_charged", batch=batch_id)],
            rerendered={t: (pid, attempt) for t, pid, attempt in self.run("tile_rerendered")},
        )

    def quiet_and_held(self, job: Running) -> bool:
        """Whether `job` is still running under its owner, no session of which is in
        the middle of a statement (a stopped worker's commit may still be under way)."""
        session = application_name(job.owner)
        found = self.run("job_held_quietly", id=job.job_id, owner=job.owner, session=session)
        return bool(found[0][0])

    def effect_counts(self) -> tuple[int, int]:
        """(effect rows, distinct tiles among them)."""
        rows, distinct = self.run("tile_effect_counts")[0]
        return rows, distinct

    def image_runs(self, batch_id: int) -> int:
        """Committed runs of the batch's callback (each wrote one row): 1 when it ran once."""
        return int(self.run("image_count", batch=batch_id)[0][0])
