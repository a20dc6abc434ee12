-- forklift 0003: what the operator tools need: per-job crash budgets, paused queues, and
-- an index for the jobs that failed or were cancelled.
-- {schema} is replaced by the quoted schema name when the migration is applied.

-- A job whose run kills its worker (segfault, OOM kill, os._exit) is charged a crash
-- as well as an attempt; at max_crashes it is quarantined (dead) whatever attempts are
-- left, so one poison job cannot spend a whole retry budget on worker restarts.
-- Constant defaults: PostgreSQL adds both columns without rewriting the table.
ALTER TABLE {schema}.jobs
    ADD COLUMN crashes integer NOT NULL DEFAULT 0,
    ADD COLUMN max_crashes integer NOT NULL DEFAULT 2;

-- NOT VALID: enforced on every row written from now on, without scanning the whole
-- table under its exclusive lock (every existing row holds the defaults, which pass).
ALTER TABLE {schema}.jobs
    ADD CONSTRAINT jobs_max_crashes_positive CHECK (max_crashes > 0) NOT VALID,
    ADD CONSTRAINT jobs_crashes_nonnegative CHECK (crashes >= 0) NOT VALID;

-- `forklift jobs list --state dead|cancelled`, `jobs retry --all-dead` and `top`'s recent
-- failures, newest first. Partial: a row enters it only when its job goes dead or is
-- cancelled, so the hot path (enqueue, claim, complete) never writes it.
CREATE INDEX jobs_failed_idx ON {schema}.jobs (state, id)
    WHERE state IN ('dead', 'cancelled');

-- A queue with a row here is paused: the claim skips it (every worker of every replica,
-- from its next claim on); jobs already running finish. Resuming deletes the row.
CREATE TABLE {schema}.paused_queues (
    queue     text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text NOT NULL
);
