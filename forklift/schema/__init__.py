"""Versioned schema migrations: apply `NNNN_name.sql` files once each, in order, under a lock."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg

from forklift import _sql
from forklift._singleton import lock_key
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
    key = lock_key(f"migrate:{schema}")
    try:
        conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        try:
            return _migrate_locked(conn, schema)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
    except psycopg.Error as exc:
        raise DatabaseError(f"migration failed: {exc}") from exc


def _migrate_locked(conn: psycopg.Connection[Any], schema: str) -> list[int]:
    quoted = _sql.render("{schema}", schema)
    with conn.transaction():
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {quoted}.schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
    rows = conn.execute(
        f"SELECT version, name, checksum FROM {quoted}.schema_migrations"
    ).fetchall()
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
                f"INSERT INTO {quoted}.schema_migrations (version, name, checksum)"
                " VALUES (%s, %s, %s)",
                (migration.version, migration.name, migration.checksum),
            )
        log.info(
            "applied migration %04d_%s to schema %s", migration.version, migration.name, schema
        )
        done.append(migration.version)
    return done
