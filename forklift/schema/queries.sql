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
