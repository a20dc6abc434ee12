"""Versioned schema migrations: apply `NNNN_name.sql` files once each, in order, under a lock."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg

from forklift import _locks, _sql
from forklift.errors import DatabaseError, MigrationError

log = logging.getLogger(__name__)

_FILENAME = re.compile(r"^(\d{4})_(\w+)\.sql$")
# A migration whose first line is ONLINE only builds and drops indexes. On a jobs table
# of more than ONLINE_ROWS rows (as last analyzed) it runs them CONCURRENTLY, outside a
# transaction, so that writes go on while they build (a plain CREATE INDEX holds them
# off for as long as it reads the table); on a smaller one, in a transaction as usual.
ONLINE = "-- forklift: online"
ONLINE_ROWS = 100_000
_ONLINE_STATEMENT = re.compile(r"^(CREATE INDEX|DROP INDEX) IF (NOT )?EXISTS (\S+)", re.I)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @property
    def online(self) -> bool:
        return self.text.startswith(ONLINE)


def queries(schema: str) -> dict[str, str]:
    """The migrator's statements, rendered for `schema`."""
    return _sql.load(__name__, "queries.sql", schema)


def migrations() -> list[Migration]:
    """The migrations shipped in this package, in version order."""
    found = []
    for entry in resources.files(__name__).iterdir():
        match = _FILENAME.match(entry.name)
        if match:
            text = entry.read_text(encoding="utf-8")
            found.append(Migration(int(match[1]), match[2], text))
    return sorted(found, key=lambda m: m.version)


def migrate(conn: psycopg.Connection[Any], schema: str = "forklift") -> list[int]:
    """Apply pending migrations on `conn` (autocommit); return the versions applied.

    Re-running is a no-op. Concurrent callers serialize on an advisory lock. An applied
    migration whose file was edited since is refused, not silently re-run.
    """
    _sql.check_schema_name(schema)
    if not conn.autocommit:
        raise MigrationError("migrate() needs an autocommit connection")
    lock = f"migrate:{schema}"
    try:
        _locks.wait(conn, lock)
        try:
            return _migrate_locked(conn, schema)
        finally:
            _locks.release(conn, lock)
    except psycopg.Error as exc:
        raise DatabaseError(f"migration failed: {exc}") from exc


def _migrate_locked(conn: psycopg.Connection[Any], schema: str) -> list[int]:
    q = queries(schema)
    with conn.transaction():
        conn.execute(q["schema_create"])
        conn.execute(q["migrations_table_create"])
    rows = conn.execute(q["migrations_applied"]).fetchall()
    applied = {version: (name, checksum) for version, name, checksum in rows}
    known = {m.version: m for m in migrations()}

    newer = sorted(set(applied) - set(known))
    if newer:
        raise MigrationError(
            f"schema {schema!r} has migration {newer[-1]} applied, which this forklift does not "
            "know: upgrade forklift before running it against this database"
        )
    for version, (name, checksum) in sorted(applied.items()):
        if known[version].checksum != checksum:
            raise MigrationError(
                f"migration {version:04d}_{name}.sql was edited after it was applied to schema "
                f"{schema!r} (checksum differs); add a new migration instead of editing one"
            )

    done = []
    for migration in known.values():
        if migration.version in applied:
            continue
        how = ""
        if migration.online and _big(conn, q):
            _apply_concurrently(conn, q, migration.text, schema)
            how = " (concurrently)"
        record = {"version": migration.version, "name": migration.name}
        with conn.transaction():
            if not how:
                if conn.execute(q["jobs_rows"]).fetchone() is not None:
                    conn.execute(q["jobs_lock"])  # the strongest lock first (jobs_lock)
                conn.execute(_sql.render(migration.text, schema).encode("utf-8"))
            conn.execute(q["migration_record"], {**record, "checksum": migration.checksum})
        log.info("applied migration %04d_%s to schema %s%s", *record.values(), schema, how)
        done.append(migration.version)
    return done


def _big(conn: psycopg.Connection[Any], q: dict[str, str]) -> bool:
    row = conn.execute(q["jobs_rows"]).fetchone()
    return row is not None and row[0] > ONLINE_ROWS


def _apply_concurrently(
    conn: psycopg.Connection[Any], q: dict[str, str], text: str, schema: str
) -> None:
    """Run an online migration's statements one by one, each CONCURRENTLY, outside a
    transaction, with no statement timeout (a build takes as long as the table is big;
    writes go on meanwhile). A build cut short (an error, a kill) leaves an invalid
    index of its name, dropped here before it is built again. The lock timeout stays:
    a build waits for the transactions whose snapshots are older than its own, and one
    held open (a long report, a REPEATABLE READ session) fails it with that error
    rather than hang it."""
    rendered = _sql.render(text, schema)
    body = "\n".join(line for line in rendered.splitlines() if not line.startswith("--"))
    statements = [s.strip() for s in body.split(";") if s.strip()]
    conn.execute("SET statement_timeout = 0")
    for statement in statements:
        match = _ONLINE_STATEMENT.match(statement)
        if match is None:
            raise MigrationError(f"an online migration only builds or drops indexes: {statement}")
        verb, _, name = match.groups()
        index = name.rpartition(".")[2].strip('"')
        params = {"schema": schema, "index": index}
        for (invalid,) in conn.execute(q["index_invalid"], params).fetchall():
            conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {invalid}")
        conn.execute(statement.replace(verb, f"{verb} CONCURRENTLY", 1).encode("utf-8"))
