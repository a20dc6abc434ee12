-- forklift 0021: snoozes, so that a handler can ask to run again later without spending
-- an attempt (forklift.Snooze; workers/completer.py). {schema} is replaced by the quoted
-- schema name when the migration is applied.
--
-- A snooze gives the job back to `ready` with its attempt returned; `snoozes` counts
-- them apart from attempts (bounded by the task's max_snoozes, read by the worker that
-- runs it) and `snoozed_at` says when the last one was, for `forklift jobs show`.
ALTER TABLE {schema}.jobs
    ADD COLUMN IF NOT EXISTS snoozes integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS snoozed_at timestamptz;
