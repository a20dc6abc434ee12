-- The statements the migrator runs. Each starts with `-- name: <name>` and a one-line
-- description; {schema} is replaced by the quoted schema name when loaded. (Migration files are the NNNN_name.sql files beside this one.)

-- name: schema_create
-- The schema forklift's tables live in.
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: migrations_table_create
-- The record of applied migrations, with the checksum of each file as applied.
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_applied
-- Every applied migration: version, name, checksum.
SELECT version, name, checksum FROM {schema}.schema_migrations;

-- name: migration_record
-- Note a migration as applied (in the transaction that applied it).
INSERT INTO {schema}.schema_migrations (version, name, checksum)
VALUES (%(version)s::integer, %(name)s::text, %(checksum)s::text);

-- name: jobs_lock
-- First in a migration's transaction, once the jobs table exists: the strongest lock a
-- migration takes on it, taken before any weaker one. A migration that took a weaker
-- lock first (CREATE INDEX's) and a stronger one later (DROP INDEX's, ALTER TABLE's)
-- deadlocked with a live worker between the two: the worker, holding what its claim had
-- read, waited for its update behind the first lock, and the migration for the second
-- behind the worker's read. Waiting here first, the migration holds nothing a worker
-- waits for (a worker's update goes ahead of a waiting lock that needs what it holds).
-- (Not taken before the first migration, which makes the table: jobs_rows says.)
LOCK TABLE {schema}.jobs IN ACCESS EXCLUSIVE MODE;

-- name: jobs_rows
-- How many rows the jobs table holds, as last analyzed; never analyzed, guessed from
-- its size (30 rows a page). No row: no such table yet.
SELECT CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint
            ELSE pg_relation_size(c.oid) / 8192 * 30 END
FROM pg_class AS c WHERE c.oid = to_regclass('{schema}.jobs');

-- name: index_invalid
-- The index of schema `schema` named `index` if it is invalid (a concurrent build cut
-- short), as a qualified name for DROP INDEX.
SELECT format('%%I.%%I', n.nspname, c.relname)
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s::text AND c.relname = %(index)s::text AND NOT i.indisvalid;
