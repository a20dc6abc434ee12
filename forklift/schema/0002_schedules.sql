-- forklift 0002: schedules (periodic jobs) and their fires in flight.
-- {schema} is replaced by the quoted schema name when the migration is applied.

-- One row per schedule any scheduler has declared: its definition as last synced (so
-- operators see it with only the database), where firing has got to, and how its jobs
-- went. Times of fires are in UTC; `tz` is the zone a cron expression is read in.
CREATE TABLE {schema}.schedules (
    name            text PRIMARY KEY,
    task            text NOT NULL,
    queue           text NOT NULL,
    cron            text,
    every_seconds   integer,
    tz              text NOT NULL,
    catchup_seconds double precision,
    overlap         boolean NOT NULL,
    definition_hash text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- When the current definition took effect; a changed one starts from then.
    defined_at      timestamptz NOT NULL,
    -- Every fire time up to here has been handled (enqueued, or skipped by policy).
    fired_through   timestamptz NOT NULL,
    next_fire_at    timestamptz,
    last_fire_at    timestamptz,
    last_job_id     bigint,
    last_success_at timestamptz,
    last_error      text,
    last_error_at   timestamptz,
    -- When a scheduler that declares it last synced it (a removed schedule ages).
    seen_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_cron_or_every CHECK ((cron IS NULL) <> (every_seconds IS NULL)),
    CONSTRAINT schedules_every_positive CHECK (every_seconds IS NULL OR every_seconds > 0)
);

-- The fires whose job has not finished yet: what overlap=False looks at, and what the
-- scheduler settles into last_success_at / last_error when the job is done.
CREATE TABLE {schema}.schedule_fires (
    schedule text NOT NULL REFERENCES {schema}.schedules (name) ON DELETE CASCADE,
    fire_at  timestamptz NOT NULL,
    job_id   bigint NOT NULL,
    PRIMARY KEY (schedule, fire_at)
);
