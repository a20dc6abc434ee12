"""Migrations on a real PostgreSQL: the canonical schema, idempotence, concurrency, refusals, CLI.

The canonical schema lives in tests/integration/canonical_schema.txt. After an intended schema
change (a new migration), regenerate it and review the diff:

    FORKLIFT_UPDATE_SNAPSHOT=1 .venv/bin/python -m pytest tests/integration/test_migrations.py
"""

from __future__ import annotations

import difflib
import os
import re
import secrets
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import forklift
from forklift import schema as migrations
from forklift.testing import wait_for

SNAPSHOT = Path(__file__).with_name("canonical_schema.txt")
UPDATE_SNAPSHOT = os.environ.get("FORKLIFT_UPDATE_SNAPSHOT") == "1"
FORKLIFT_BIN = Path(sys.executable).with_name("forklift")
PLACEHOLDER = "{schema}"
# Every shipped migration, as migrate() returns their versions and the table records them.
ALL = [m.version for m in migrations.migrations()]
ALL_APPLIED = [(m.version, m.name) for m in migrations.migrations()]
ALL_SHOWN = ", ".join(f"{v:04d}" for v in ALL)  # as `forklift migrate` prints them


@pytest.fixture
def new_schema(dsn: str) -> Iterator[Callable[[], str]]:
    """Hands out unique schema names (not yet created); drops all of them after the test."""
    names: list[str] = []

    def make() -> str:
        name = f"t_mig_{secrets.token_hex(5)}"
        names.append(name)
        return name

    yield make
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def fresh(new_schema: Callable[[], str]) -> str:
    return new_schema()


# -- catalog introspection ---------------------------------------------------------------

_RELKINDS = {"r": "table", "p": "partitioned table", "i": "index", "S": "sequence", "v": "view"}
_NS = "(SELECT oid FROM pg_namespace WHERE nspname = %(schema)s)"  # the schema's oid

Conn = psycopg.Connection[Any]


def _rows(conn: Conn, sql: str, schema: str) -> list[tuple[Any, ...]]:
    return conn.execute(sql, {"schema": schema}).fetchall()


def _enums(conn: Conn, schema: str) -> list[str]:
    rows = _rows(
        conn,
        f"""SELECT t.typname, array_agg(e.enumlabel ORDER BY e.enumsortorder)
           FROM pg_type t JOIN pg_enum e ON e.enumtypid = t.oid
           WHERE t.typnamespace = {_NS} GROUP BY t.typname ORDER BY t.typname""",
        schema,
    )
    return [f"enum {typname}: {', '.join(labels)}" for typname, labels in rows]


def _types(conn: Conn, schema: str) -> list[str]:
    """Types other than enums, arrays and the row types of tables."""
    rows = _rows(
        conn,
        f"""SELECT t.typname, t.typtype FROM pg_type t
           LEFT JOIN pg_class c ON c.oid = t.typrelid
           WHERE t.typnamespace = {_NS} AND t.typtype <> 'e'
             AND t.typelem = 0 AND coalesce(c.relkind, 'c') = 'c'
           ORDER BY t.typname""",
        schema,
    )
    return [f"type {typname}: typtype={typtype}" for typname, typtype in rows]


def _relations(conn: Conn, schema: str) -> list[str]:
    out = []
    for relname, relkind, persistence, options in _rows(
        conn,
        f"""SELECT c.relname, c.relkind, c.relpersistence, c.reloptions FROM pg_class c
           WHERE c.relnamespace = {_NS} ORDER BY c.relname""",
        schema,
    ):
        line = f"{_RELKINDS.get(relkind, f'relkind={relkind}')} {relname}"
        if persistence != "p":
            line += f" persistence={persistence}"
        if options:
            line += f" WITH ({', '.join(sorted(options))})"
        out.append(line)
    return out


def _columns(conn: Conn, schema: str) -> list[str]:
    out = []
    for relname, attname, typ, notnull, default, identity, generated in _rows(
        conn,
        f"""SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
                  a.attnotnull, pg_get_expr(d.adbin, d.adrelid), a.attidentity,
                  a.attgenerated
           FROM pg_attribute a
           JOIN pg_class c ON c.oid = a.attrelid
           LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
           WHERE c.relnamespace = {_NS} AND c.relkind IN ('r', 'p', 'v')
             AND a.attnum > 0 AND NOT a.attisdropped
           ORDER BY c.relname, a.attnum""",
        schema,
    ):
        line = f"column {relname}.{attname} {typ}"
        if notnull:
            line += " NOT NULL"
        if default is not None:
            line += f" DEFAULT {default}"
        if identity:
            line += f" IDENTITY {'ALWAYS' if identity == 'a' else 'BY DEFAULT'}"
        if generated:
            line += f" GENERATED={generated}"
        out.append(line)
    return out


def _constraints(conn: Conn, schema: str) -> list[str]:
    # contype 'n' (NOT NULL as constraints, PostgreSQL 18+) is already in the columns.
    rows = _rows(
        conn,
        f"""SELECT c.relname, con.conname, pg_get_constraintdef(con.oid)
           FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid
           WHERE con.connamespace = {_NS} AND con.contype <> 'n'
           ORDER BY c.relname, con.conname""",
        schema,
    )
    return [
        f"constraint {relname}.{conname}: {definition}" for relname, conname, definition in rows
    ]


def _indexes(conn: Conn, schema: str) -> list[str]:
    rows = _rows(
        conn,
        f"""SELECT i.relname, pg_get_indexdef(i.oid)
           FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
           WHERE i.relnamespace = {_NS} ORDER BY i.relname""",
        schema,
    )
    return [f"index {indexname}: {definition}" for indexname, definition in rows]


def _sequences(conn: Conn, schema: str) -> list[str]:
    """Each sequence's settings and the column that owns it."""
    rows = _rows(
        conn,
        f"""SELECT c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement,
                  s.seqmin, s.seqmax, s.seqcache, s.seqcycle,
                  (SELECT t.relname || '.' || a.attname FROM pg_depend dep
                   JOIN pg_class t ON t.oid = dep.refobjid
                   JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = dep.refobjsubid
                   WHERE dep.classid = 'pg_class'::regclass AND dep.objid = c.oid
                     AND dep.deptype IN ('a', 'i'))
           FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
           WHERE c.relnamespace = {_NS} ORDER BY c.relname""",
        schema,
    )
    return [
        f"sequence {seqname}: {typ} start={start} increment={inc} min={lo} max={hi}"
        f" cache={cache} cycle={cycle} owned_by={owner}"
        for seqname, typ, start, inc, lo, hi, cache, cycle, owner in rows
    ]


def _triggers(conn: Conn, schema: str) -> list[str]:
    rows = _rows(
        conn,
        f"""SELECT t.tgname, t.tgenabled, pg_get_triggerdef(t.oid)
           FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
           WHERE c.relnamespace = {_NS} AND NOT t.tgisinternal
           ORDER BY c.relname, t.tgname""",
        schema,
    )
    return [
        f"trigger {tgname} (enabled={enabled}): {definition}"
        for tgname, enabled, definition in rows
    ]


def _functions(conn: Conn, schema: str) -> list[str]:
    """Each function's signature, then its definition indented."""
    out = []
    for proname, args, definition in _rows(
        conn,
        f"""SELECT p.proname, pg_get_function_identity_arguments(p.oid),
                  pg_get_functiondef(p.oid)
           FROM pg_proc p WHERE p.pronamespace = {_NS}
           ORDER BY p.proname, 2""",
        schema,
    ):
        out.append(f"function {proname}({args}):")
        out.extend(f"    {line}".rstrip() for line in definition.strip().splitlines())
    return out


# The parts of the catalog description, in the order they appear in it.
_CATALOG_PARTS: tuple[Callable[[Conn, str], list[str]], ...] = (
    _enums,
    _types,
    _relations,
    _columns,
    _constraints,
    _indexes,
    _sequences,
    _triggers,
    _functions,
)


def catalog(dsn: str, schema: str) -> str:
    """A deterministic text description of everything in `schema`, with its name replaced."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = _rows(conn, "SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s", schema)
        assert exists, f"schema {schema} does not exist"
        out = [line for part in _CATALOG_PARTS for line in part(conn, schema)]
    text = "\n".join(line.rstrip() for line in out) + "\n"
    # The schema name appears quoted or bare (quote_ident); either way it becomes {schema}.
    return re.sub(rf'"{schema}"|\b{schema}\b', PLACEHOLDER, text)


HEADER = """\
# The canonical forklift schema: what migrating an empty schema must produce.
# Generated by tests/integration/test_migrations.py; {schema} stands for the schema name.
# Regenerate after adding a migration: FORKLIFT_UPDATE_SNAPSHOT=1 pytest tests/integration
"""


def assert_matches_snapshot(actual: str) -> None:
    if not SNAPSHOT.exists():
        pytest.fail(f"{SNAPSHOT} is missing: generate it with FORKLIFT_UPDATE_SNAPSHOT=1")
    expected = SNAPSHOT.read_text(encoding="utf-8").removeprefix(HEADER)
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                fromfile=f"{SNAPSHOT.name} (expected)",
                tofile="migrated schema (actual)",
            )
        )
        pytest.fail(
            "the migrated schema differs from the canonical schema.\n"
            "If the change is intended, regenerate the snapshot with\n"
            "  FORKLIFT_UPDATE_SNAPSHOT=1 pytest tests/integration/test_migrations.py\n"
            f"and review it.\n\n{diff}",
            pytrace=False,
        )


def migrate_all(dsn: str, schema: str, n: int) -> tuple[list[list[int]], list[BaseException]]:
    """Run `n` App.migrate() calls on `schema` at once, from n threads."""
    barrier = threading.Barrier(n)
    results: list[list[int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            app = forklift.App(dsn, schema=schema)
            barrier.wait(timeout=30)
            applied = app.migrate()
        except BaseException as exc:
            with lock:
                errors.append(exc)
        else:
            with lock:
                results.append(applied)

    threads = [threading.Thread(target=run, name=f"migrate-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert not any(t.is_alive() for t in threads), "a migrate() call hung"
    return results, errors


def applied_versions(dsn: str, schema: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            f'SELECT version, name FROM "{schema}".schema_migrations ORDER BY version'
        ).fetchall()
    return [(int(v), str(n)) for v, n in rows]


# -- the canonical schema ----------------------------------------------------------------


def test_fresh_schema_matches_the_canonical_schema(dsn: str, fresh: str) -> None:
    assert forklift.App(dsn, schema=fresh).migrate() == ALL
    actual = catalog(dsn, fresh)
    if UPDATE_SNAPSHOT:
        SNAPSHOT.write_text(HEADER + actual, encoding="utf-8")
    assert_matches_snapshot(actual)
    assert applied_versions(dsn, fresh) == ALL_APPLIED


def test_catalog_does_not_depend_on_the_schema_name(
    dsn: str, new_schema: Callable[[], str]
) -> None:
    a, b = new_schema(), new_schema()
    forklift.App(dsn, schema=a).migrate()
    forklift.App(dsn, schema=b).migrate()
    assert catalog(dsn, a) == catalog(dsn, b)
    assert a not in catalog(dsn, a)


def test_shipped_migrations_are_numbered_without_gaps() -> None:
    versions = [m.version for m in migrations.migrations()]
    assert versions == list(range(1, len(versions) + 1))


# -- idempotence and concurrency ---------------------------------------------------------


def test_rerunning_migrate_is_a_no_op(dsn: str, fresh: str) -> None:
    app = forklift.App(dsn, schema=fresh)
    assert app.migrate() == ALL
    before = catalog(dsn, fresh)
    assert app.migrate() == []
    assert app.migrate() == []
    assert catalog(dsn, fresh) == before
    assert applied_versions(dsn, fresh) == ALL_APPLIED


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_migrations_apply_each_version_once(dsn: str, fresh: str, round_: int) -> None:
    results, errors = migrate_all(dsn, fresh, 4)
    assert errors == []
    assert len(results) == 4
    assert sorted(v for applied in results for v in applied) == ALL
    assert sorted(results) == [[], [], [], ALL]
    assert applied_versions(dsn, fresh) == ALL_APPLIED
    assert_matches_snapshot(catalog(dsn, fresh))


def test_concurrent_cli_processes_apply_each_version_once(dsn: str, fresh: str) -> None:
    procs = [
        subprocess.Popen(
            [str(FORKLIFT_BIN), "migrate", "--dsn", dsn, "--schema", fresh],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        outputs.append(out)
    assert sum(f"applied migrations {ALL_SHOWN} " in out for out in outputs) == 1, outputs
    assert sum("up to date" in out for out in outputs) == 3, outputs


def test_schemas_migrate_independently(dsn: str, new_schema: Callable[[], str]) -> None:
    a, b = new_schema(), new_schema()
    assert forklift.App(dsn, schema=a).migrate() == ALL
    assert forklift.App(dsn, schema=b).migrate() == ALL
    assert forklift.App(dsn, schema=a).migrate() == []


# -- refusals ----------------------------------------------------------------------------


def test_edited_migration_is_refused(dsn: str, fresh: str) -> None:
    app = forklift.App(dsn, schema=fresh)
    app.migrate()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{fresh}".schema_migrations SET checksum = %s WHERE version = 1', ("x",)
        )
    with pytest.raises(forklift.MigrationError, match="edited") as info:
        app.migrate()
    assert "0001_initial" in str(info.value)
    assert fresh in str(info.value)

    # The refusal released the migration lock: once repaired, migrate runs (and is a no-op).
    real = migrations.migrations()[0].checksum
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{fresh}".schema_migrations SET checksum = %s WHERE version = 1', (real,)
        )
    assert app.migrate() == []


def test_unknown_applied_version_is_refused(dsn: str, fresh: str) -> None:
    app = forklift.App(dsn, schema=fresh)
    app.migrate()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{fresh}".schema_migrations (version, name, checksum)'
            " VALUES (9999, 'from_the_future', 'x')"
        )
    with pytest.raises(forklift.MigrationError, match="upgrade") as info:
        app.migrate()
    assert "9999" in str(info.value)

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DELETE FROM "{fresh}".schema_migrations WHERE version = 9999')
    assert app.migrate() == []


def test_migrate_needs_an_autocommit_connection(dsn: str, fresh: str) -> None:
    with (
        psycopg.connect(dsn) as conn,
        pytest.raises(forklift.MigrationError, match="autocommit"),
    ):
        migrations.migrate(conn, fresh)


def test_failed_migration_leaves_nothing_behind(dsn: str, fresh: str) -> None:
    # A table in the way makes 0001 fail halfway: none of it may stay, nor its record.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{fresh}"')
        conn.execute(f'CREATE TABLE "{fresh}".processes (x int)')
    app = forklift.App(dsn, schema=fresh)
    with pytest.raises(forklift.DatabaseError, match="processes"):
        app.migrate()
    with psycopg.connect(dsn, autocommit=True) as conn:
        leftovers = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname NOT LIKE 'schema_migrations%%'"
            " ORDER BY 1",
            (fresh,),
        ).fetchall()
        types = conn.execute(
            "SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
            " WHERE n.nspname = %s AND t.typtype = 'e'",
            (fresh,),
        ).fetchall()
        assert leftovers == [("processes",)]
        assert types == []
        conn.execute(f'DROP TABLE "{fresh}".processes')
    assert applied_versions(dsn, fresh) == []
    assert app.migrate() == ALL
    assert_matches_snapshot(catalog(dsn, fresh))


ONLINE = [m for m in migrations.migrations() if m.online]


def test_online_migrations_only_build_and_drop_indexes() -> None:
    assert [m.version for m in ONLINE] == [16, 17, 24, 26]
    for migration in ONLINE:
        body = [line for line in migration.text.splitlines() if not line.startswith("--")]
        statements = [s.strip() for s in "\n".join(body).split(";") if s.strip()]
        assert statements and all(
            re.match(r"(CREATE INDEX IF NOT EXISTS|DROP INDEX IF EXISTS) ", s) for s in statements
        ), migration.name


def test_on_a_big_table_an_online_migration_builds_concurrently_and_rebuilds_a_cut_one(
    dsn: str, fresh: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Over ONLINE_ROWS jobs (here 0: any table counts as big) the index builds run
    CONCURRENTLY, outside a transaction, and come out as a plain run makes them; a build
    cut short leaves an invalid index of its name, dropped and built again on the next
    run (IF NOT EXISTS alone would keep it, invalid, for ever)."""
    monkeypatch.setattr(migrations, "ONLINE_ROWS", -1)
    app = forklift.App(dsn, schema=fresh)
    with caplog.at_level("INFO", logger="forklift.schema"):
        assert app.migrate() == ALL
    # 0017, 0024 and 0026 drop some, too
    for name in (
        "0016_claim_floor", "0017_scheduled_index", "0024_fair_indexes", "0026_labelled_indexes"
    ):  # fmt: skip
        assert re.search(f"applied migration {name} to schema .* \\(concurrently\\)", caplog.text)
    assert_matches_snapshot(catalog(dsn, fresh))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DELETE FROM "{fresh}".schema_migrations WHERE version = 26')
        conn.execute(  # as a build killed halfway leaves it
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass",
            (f'"{fresh}".jobs_ready_open_idx',),
        )
    assert app.migrate() == [26]
    assert_matches_snapshot(catalog(dsn, fresh))
    with psycopg.connect(dsn, autocommit=True) as conn:
        invalid = conn.execute(
            "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND NOT i.indisvalid",
            (fresh,),
        ).fetchone()
    assert invalid == (0,)


def test_a_migration_never_deadlocks_with_a_worker_mid_claim(dsn: str, fresh: str) -> None:
    """A worker mid-claim holds what its claim read (AccessShareLock on jobs) and then
    updates (RowExclusiveLock). Migration 0024 (here 0026, its like) builds indexes
    (ShareLock), then drops some (AccessExclusiveLock): applied in a transaction, it
    deadlocked with such a worker between the two (CI: test_first_run's supervisor, whose
    worker began claiming once 0023 was in). Each migration now takes the strongest lock
    first (jobs_lock): it waits while the worker finishes, and both go through."""
    app = forklift.App(dsn, schema=fresh)
    app.migrate()
    undo_0026 = [
        *(f'DROP INDEX "{fresh}".{name}' for name in (
            "jobs_ready_labelled_idx", "jobs_ready_open_idx", "jobs_ready_open_ranked_idx")),
        f'CREATE INDEX jobs_ready_plain_idx ON "{fresh}".jobs (queue, available_at, id)'
        " WHERE state = 'ready' AND limit_key IS NULL AND fair_key IS NULL AND priority = 0",
        f'DELETE FROM "{fresh}".schema_migrations WHERE version = 26',
    ]  # fmt: skip
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in undo_0026:
            conn.execute(statement)
    outcome: list[object] = []
    with psycopg.connect(dsn) as worker, psycopg.connect(dsn, autocommit=True) as db:
        worker.execute(f'SELECT id FROM "{fresh}".jobs LIMIT 1')  # a claim's read, held
        migrating = threading.Thread(target=lambda: outcome.append(_migrated(app)))
        migrating.start()
        wait_for(  # the migration waits for a lock on jobs
            lambda: db.execute(
                "SELECT 1 FROM pg_locks WHERE relation = %s::regclass AND NOT granted",
                (f'"{fresh}".jobs',),
            ).fetchone(),
            what="the migration waiting for a lock on jobs",
        )
        worker.execute(f'UPDATE "{fresh}".jobs SET priority = 1 WHERE false')  # its update
        worker.commit()
        migrating.join(timeout=30)
    assert outcome == [[26]]


def _migrated(app: forklift.App) -> object:
    try:
        return app.migrate()
    except forklift.DatabaseError as exc:
        return exc


def test_unreachable_database_is_a_database_error(fresh: str) -> None:
    app = forklift.App("postgresql://u:hunter2@127.0.0.1:1/x?connect_timeout=2", schema=fresh)
    with pytest.raises(forklift.DatabaseError) as info:
        app.migrate()
    assert "hunter2" not in str(info.value)


# -- the CLI -----------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKLIFT_")}
    return subprocess.run(
        [str(FORKLIFT_BIN), *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_cli_migrate_applies_then_reports_up_to_date(dsn: str, fresh: str) -> None:
    assert FORKLIFT_BIN.exists(), FORKLIFT_BIN
    first = run_cli("migrate", "--dsn", dsn, "--schema", fresh)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"applied migrations {ALL_SHOWN} to {fresh}"

    second = run_cli("migrate", "--dsn", dsn, "--schema", fresh)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == f"schema {fresh} is up to date"
    assert "Traceback" not in first.stderr + second.stderr
    assert_matches_snapshot(catalog(dsn, fresh))


def test_cli_migrate_refusal_is_a_clean_error(dsn: str, fresh: str) -> None:
    forklift.App(dsn, schema=fresh).migrate()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'UPDATE "{fresh}".schema_migrations SET checksum = %s', ("x",))
    result = run_cli("migrate", "--dsn", dsn, "--schema", fresh)
    assert result.returncode == 1
    assert result.stderr.startswith("forklift: error: migration 0001_initial.sql was edited")
    assert "Traceback" not in result.stderr


def test_cli_migrate_unreachable_database_is_a_clean_error(fresh: str) -> None:
    bad = "postgresql://u:hunter2@127.0.0.1:1/x?connect_timeout=2"
    result = run_cli("migrate", "--dsn", bad, "--schema", fresh)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("forklift: error:"), result.stderr
    assert "hunter2" not in result.stderr


def test_cli_migrate_refuses_a_bad_schema_name(dsn: str) -> None:
    result = run_cli("migrate", "--dsn", dsn, "--schema", "Bad-Name")
    assert result.returncode == 1
    assert "forklift: error: schema name 'Bad-Name'" in result.stderr
