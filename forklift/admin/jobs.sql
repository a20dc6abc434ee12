-- The operator's job queries (forklift jobs list|show|retry|cancel|purge, top). Each
-- starts with `-- name: <name>` and a one-line description; {schema} becomes the quoted
-- schema name, {channel} the channel idle workers wake on and {control_channel} the one
-- on which workers hear orders. A NULL filter parameter means "any".

-- name: job_list
-- A page of jobs, newest first: a window of at most `window` jobs (of `state`, older
-- than `before`; with `scheduled`, the ready ones due later) is scanned in id order,
-- through the primary key, the dead/cancelled index or, for scheduled jobs, the index of
-- jobs put off (jobs_scheduled_idx: a job due after now() was due after its creation,
-- said here so that PostgreSQL may read it), and filtered by queue, task and error text;
-- never more than the window is read. Ready jobs are read through the three indexes of
-- ready jobs: with a limit, without one, and those that require labels
-- (jobs_ready_limited_idx, jobs_ready_unlabelled_idx, jobs_ready_labelled_idx): a
-- condition true of every job says there are three kinds, so that PostgreSQL reads all.
-- No index holds every ready job, because the claim would read it (migration 0017).
SELECT w.id, w.queue, w.task, w.state::text AS state, w.priority, w.attempts,
       w.max_attempts, w.crashes, w.max_crashes, w.created_at, w.available_at, w.started_at,
       w.completed_at, w.lease_owner, w.last_error,
       extract(epoch FROM now() - w.created_at)::float8 AS age
FROM (
    SELECT j.* FROM {schema}.jobs AS j
    WHERE (%(state)s::{schema}.job_state IS NULL OR j.state = %(state)s::{schema}.job_state)
      AND (NOT %(scheduled)s::boolean
           OR (j.available_at > now() AND j.available_at > j.created_at))
      AND (j.limit_key IS NOT NULL OR (j.limit_key IS NULL AND j.requires IS NULL)
           OR j.requires IS NOT NULL)
      AND (%(before)s::bigint IS NULL OR j.id < %(before)s::bigint)
    ORDER BY j.id DESC
    LIMIT %(window)s
) AS w
WHERE (%(queue)s::text IS NULL OR w.queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR w.task = %(task)s::text)
  AND (%(error)s::text IS NULL OR w.last_error ILIKE %(error)s::text)
ORDER BY w.id DESC
LIMIT %(limit)s;

-- name: job_list_window
-- How many jobs the window of a job_list holds, and the oldest id in it (where a next
-- page would start when this one came out short).
SELECT count(*) AS scanned, min(w.id) AS oldest FROM (
    SELECT j.id FROM {schema}.jobs AS j
    WHERE (%(state)s::{schema}.job_state IS NULL OR j.state = %(state)s::{schema}.job_state)
      AND (NOT %(scheduled)s::boolean
           OR (j.available_at > now() AND j.available_at > j.created_at))
      AND (j.limit_key IS NOT NULL OR (j.limit_key IS NULL AND j.requires IS NULL)
           OR j.requires IS NOT NULL)
      AND (%(before)s::bigint IS NULL OR j.id < %(before)s::bigint)
    ORDER BY j.id DESC
    LIMIT %(window)s
) AS w;

-- name: job_get
-- One job, everything about it (its result as JSON text, its last progress, its batch,
-- its limit key, the worker that ran its last successful attempt, the attempts added
-- for lost leases it was forgiven, its checkpoint and when it was written, its snoozes
-- and when it last snoozed, its unique key, its fair key, weight and turn), with the
-- database's clock for the ages.
SELECT j.id, j.queue, j.task, j.state::text AS state, j.priority, j.attempts,
       j.max_attempts, j.crashes, j.max_crashes, j.created_at, j.available_at, j.started_at,
       j.completed_at, j.lease_owner, j.last_error,
       extract(epoch FROM now() - j.created_at)::float8 AS age,
       j.args::text AS args, j.idempotency_key, j.timeout, j.lease_until, j.errors,
       now() AS now, j.result::text AS result, j.progress, j.batch_id, j.limit_key, j.ran_by,
       j.leases_forgiven, j.checkpoint, j.checkpoint_at, j.workflow_id, j.step,
       j.waiting_on, j.upstream_failed, j.snoozes, j.snoozed_at, j.unique_key,
       j.unique_states, j.fair_key, j.fair_weight, j.fair_turn, j.requires
FROM {schema}.jobs AS j
WHERE j.id = %(id)s::bigint;

-- name: job_retry_many
-- Dead or cancelled jobs back to ready now (a workflow job still waiting for its upstream
-- jobs: blocked, or cancelled again if one it needs is dead or cancelled: migration
-- 0020's workflow_hold, `became`), attempts, crashes and snoozes reset to 0 and the
-- attempts added for lost leases taken back (a fresh budget, as enqueued), the retry
-- noted in the error history; wakes their queues' workers. A checkpoint is kept (the
-- job resumes from it) unless `scratch` (`--from-scratch`): then it is cleared. A unique
-- job whose key another live job holds now is not retried (`held_by`: that job; the
-- retry would be a second live job of its key: migration 0022). Returns every job
-- found with its state, attempts and crashes before, whether it was retried, and what
-- became of its checkpoint (kept, cleared; NULL: it had none).
WITH old AS (
    SELECT j.id, j.state, j.attempts, j.crashes, j.batch_id,
           j.checkpoint IS NOT NULL AS checkpointed,
           (SELECT h.id FROM {schema}.jobs AS h
            WHERE j.unique_key IS NOT NULL AND h.unique_key = j.unique_key AND h.id <> j.id
              AND {schema}.unique_holds(h.state, h.unique_states)
            LIMIT 1) AS held_by
    FROM {schema}.jobs AS j
    WHERE j.id = ANY(%(ids)s::bigint[])
    ORDER BY j.id
    FOR UPDATE OF j
), batch AS (
    -- Held until commit: a batch's finisher (which locks its row) either sees these jobs
    -- open again, or finished the batch first (then they run outside it: it stays done).
    SELECT b.id FROM {schema}.batches AS b
    WHERE b.id IN (SELECT old.batch_id FROM old WHERE old.state IN ('dead', 'cancelled'))
    ORDER BY b.id
    FOR SHARE
), retried AS (
    UPDATE {schema}.jobs AS j SET
        state = 'ready', available_at = now(), completed_at = NULL, attempts = 0, crashes = 0,
        snoozes = 0, max_attempts = j.max_attempts - j.leases_forgiven, leases_forgiven = 0,
        checkpoint = CASE WHEN %(scratch)s::boolean THEN NULL ELSE j.checkpoint END,
        checkpoint_at = CASE WHEN %(scratch)s::boolean THEN NULL ELSE j.checkpoint_at END,
        errors = j.errors || jsonb_build_object(
            'attempt', j.attempts, 'at', now(), 'worker', NULL,
            'error', format('Retried by %%s: attempts %%s and crashes %%s reset to 0%%s',
                            %(by)s::text, j.attempts, j.crashes,
                            CASE WHEN NOT old.checkpointed THEN ''
                                 WHEN %(scratch)s::boolean THEN ', checkpoint cleared'
                                 ELSE ', resumes from its checkpoint' END))
    FROM old
    WHERE j.id = old.id AND old.state IN ('dead', 'cancelled') AND old.held_by IS NULL
      AND (SELECT count(*) FROM batch) >= 0
    RETURNING j.id, j.queue, j.state::text AS became
), woken AS (
    SELECT count(pg_notify('{channel}', q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM retried) AS q
)
SELECT old.id, old.state::text AS was, old.attempts, old.crashes,
       old.id IN (SELECT id FROM retried WHERE became <> 'cancelled') AS done,
       (SELECT r.became FROM retried AS r WHERE r.id = old.id) AS became,
       CASE WHEN old.id NOT IN (SELECT id FROM retried) OR NOT old.checkpointed THEN NULL
            WHEN %(scratch)s::boolean THEN 'cleared' ELSE 'kept' END AS checkpoint,
       old.held_by
FROM old, woken
ORDER BY old.id;

-- name: job_dead_ids
-- A batch of dead jobs' ids (of a queue, of a task), in id order after `after`, through
-- the dead/cancelled index.
SELECT j.id FROM {schema}.jobs AS j
WHERE j.state = 'dead' AND j.id > %(after)s::bigint
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR j.task = %(task)s::text)
ORDER BY j.id
LIMIT %(limit)s;

-- name: job_purge_cutoff
-- The time before which finished jobs are old enough to purge (the database's clock).
SELECT now() - make_interval(secs => %(older)s::float8);

-- name: job_purge_count
-- How many jobs of a finished state completed before the cutoff (counted up to `cap`),
-- but those retention keeps too: a job of a batch that holds its jobs (batch_holds).
SELECT count(*) FROM (
    SELECT 1 FROM {schema}.jobs AS j
    WHERE j.state = %(state)s::{schema}.job_state AND j.completed_at < %(cutoff)s
      AND (j.batch_id IS NULL OR NOT {schema}.batch_holds(j.batch_id))
      AND (j.workflow_id IS NULL OR NOT {schema}.workflow_holds(j.workflow_id))
    LIMIT %(cap)s
) AS old;

-- name: job_purge_batch
-- Delete up to `limit` jobs of a finished state completed before the cutoff, oldest
-- first through the completion-time index (so a batch never rescans the rows earlier
-- batches deleted); rows another transaction holds are skipped, never waited for. A job
-- of a batch that holds its jobs (not finished, or its callback not: batch_holds) stays,
-- as retention leaves it: its callback reads it, its batch's outcome counts it.
DELETE FROM {schema}.jobs
WHERE id IN (
    SELECT j.id FROM {schema}.jobs AS j
    WHERE j.state = %(state)s::{schema}.job_state AND j.completed_at < %(cutoff)s
      AND (j.batch_id IS NULL OR NOT {schema}.batch_holds(j.batch_id))
      AND (j.workflow_id IS NULL OR NOT {schema}.workflow_holds(j.workflow_id))
    ORDER BY j.completed_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
);

-- name: job_running_list
-- Every running job: who runs it, for how long, how far it said it is, how long ago its
-- checkpoint was written (NULL: it has none) (through the running-jobs index).
SELECT j.id, j.queue, j.task, j.lease_owner AS owner, j.attempts AS attempt,
       extract(epoch FROM now() - j.started_at)::float8 AS running_for, j.progress,
       CASE WHEN j.checkpoint IS NOT NULL
            THEN extract(epoch FROM now() - coalesce(j.checkpoint_at, now()))::float8
       END AS checkpoint_age
FROM {schema}.jobs AS j
WHERE j.state = 'running'
ORDER BY j.started_at, j.id;

-- name: job_dead_recent
-- The newest dead jobs: id, queue, task, seconds since they died, their last error.
SELECT j.id, j.queue, j.task, extract(epoch FROM now() - j.completed_at)::float8 AS ago,
       j.last_error AS error
FROM {schema}.jobs AS j
WHERE j.state = 'dead'
ORDER BY j.id DESC
LIMIT %(limit)s;

-- name: job_finished_per_minute
-- Per minute of the last `minutes` (the current, partial one last): jobs that succeeded
-- and that went dead, every minute present; a range of the completion-time index read
-- from the index alone (its cost grows with the jobs finished in that time).
SELECT m.at, coalesce(f.succeeded, 0)::bigint AS succeeded, coalesce(f.dead, 0)::bigint AS dead
FROM generate_series(date_trunc('minute', now())
                         - make_interval(mins => %(minutes)s::integer - 1),
                     date_trunc('minute', now()), interval '1 minute') AS m(at)
LEFT JOIN (
    SELECT date_trunc('minute', j.completed_at) AS at,
           count(*) FILTER (WHERE j.state = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE j.state = 'dead') AS dead
    FROM {schema}.jobs AS j
    WHERE j.state IN ('succeeded', 'dead', 'cancelled')
      AND j.completed_at >= date_trunc('minute', now())
                            - make_interval(mins => %(minutes)s::integer - 1)
    GROUP BY 1
) AS f ON f.at = m.at
ORDER BY m.at;
