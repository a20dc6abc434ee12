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


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


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
        with conn.transaction():
            conn.execute(_sql.render(migration.text, schema).encode("utf-8"))
            conn.execute(
                q["migration_record"],
                {
                    "version": migration.version,
                    "name": migration.name,
                    "checksum": migration.checksum,
                },
            )
        log.info(
            "applied migration %04d_%s to schema %s", migration.version, migration.name, schema
        )
        done.append(migration.version)
    return done
