-- forklift 0005: results, progress and batches.
-- {schema} is replaced by the quoted schema name when the migration is applied.
--
-- Every ADD COLUMN has a constant default or none: PostgreSQL adds them without
-- rewriting the table.

ALTER TABLE {schema}.jobs
    -- The handler's return value (JSON), written by the fenced completion; NULL: none.
    ADD COLUMN result jsonb,
    -- How far a running job is: {"done", "total", "message", "at"} (ctx.progress),
    -- written at most twice a second per job, off the effect transaction.
    ADD COLUMN progress jsonb,
    -- The batch the job belongs to (no foreign key: a bulk enqueue of a 100,000-job
    -- batch would check it row by row).
    ADD COLUMN batch_id bigint,
    -- Someone waits for this job's end (app.result()): its completion, death or cancel
    -- then notifies `<schema>_done` with 'j<id>'. Nobody waiting costs nothing.
    ADD COLUMN waited boolean NOT NULL DEFAULT false;

-- A batch is finished when it is sealed and none of its jobs is ready or running; its
-- callback is enqueued in the transaction that sets finished_at, once.
CREATE TABLE {schema}.batches (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    total           integer NOT NULL DEFAULT 0,     -- jobs added (by its one producer)
    -- The on_complete job as enqueue builds it: {queue, task, args, priority,
    -- max_attempts, max_crashes, timeout}; NULL: no callback.
    callback        jsonb,
    callback_job_id bigint,
    outcome         text,                           -- once finished
    created_at      timestamptz NOT NULL DEFAULT now(),
    sealed_at       timestamptz,                    -- no jobs are added after this
    cancelled_at    timestamptz,
    cancelled_by    text,
    finished_at     timestamptz,
    CONSTRAINT batches_total_nonnegative CHECK (total >= 0),
    CONSTRAINT batches_outcome CHECK (outcome IS NULL OR outcome IN ('succeeded', 'failed', 'cancelled')),
    CONSTRAINT batches_finished_when_sealed CHECK (finished_at IS NULL OR sealed_at IS NOT NULL)
);

-- Batches not finished yet: the sweep's, `batches list`'s.
CREATE INDEX batches_open_idx ON {schema}.batches (id) WHERE finished_at IS NULL;
-- Finished batches by time: retention.
CREATE INDEX batches_finished_idx ON {schema}.batches (finished_at) WHERE finished_at IS NOT NULL;

-- A batch's jobs, in two indexes that a claim never writes (a job's running rows are found
-- through jobs_running_idx, among all running jobs): each batch job adds one entry when it
-- becomes ready (enqueue, retry, release) and one when it ends, none per claim.
-- Its ready jobs: whether any is left, read backwards from the jobs claimed last.
CREATE INDEX jobs_batch_ready_idx ON {schema}.jobs (batch_id, id)
    WHERE batch_id IS NOT NULL AND state = 'ready';
-- Its finished jobs: counts, results, dead jobs, in id order.
CREATE INDEX jobs_batch_finished_idx ON {schema}.jobs (batch_id, id)
    WHERE batch_id IS NOT NULL AND state IN ('succeeded', 'dead', 'cancelled');
