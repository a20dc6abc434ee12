-- Every query of the job store. Each starts with `-- name: <name>` and a one-line
-- description; when loaded, {schema} becomes the quoted schema name and {channel} the
-- notification channel on which workers hear of ready jobs.
--
-- The writes over a worker's leases (renewal, completion, release, progress) share one
-- shape: `mine` takes the (id, attempt) leases one at a time, as the caller sends them
-- (sorted by id: every write over many jobs locks them in id order, or two could
-- deadlock), and locks each job that this owner still holds at that attempt
-- (`{_held_lease}`, below).

-- name: _held_lease
-- A fragment, not a query (`_sql.parse`): the job of lease `h` (id, attempt), locked if
-- `%(owner)s` still holds it at that attempt; by its primary key, once per lease,
-- whatever the plan. A join of the leases with the jobs, planned generically for a
-- prepared statement, put the unnested leases inside a nested loop: 128 completions
-- walked 16,384 rows. A lease owner means the job is running (jobs_lease_when_running);
-- said again as `state = 'running'`, it would let the planner look each lease up in the
-- running index, walking every job of this owner each time.
LATERAL (
        SELECT j.id FROM {schema}.jobs AS j
        WHERE j.id = h.id AND j.attempts = h.attempt AND j.lease_owner = %(owner)s::text
        FOR UPDATE
    ) AS j

-- name: job_insert
-- Insert one job; with an idempotency key already taken, insert nothing.
INSERT INTO {schema}.jobs ({_job_columns}, idempotency_key, available_at)
SELECT {_job_columns}, idempotency_key, {_job_due}
FROM (VALUES ({_job_values})) AS j({_job_columns}, idempotency_key, run_at, delay)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: job_insert_quiet
-- job_insert for forklift's own autocommit connection: the insert's transaction is marked
-- quiet first (the row comes from the subquery that sets it), so the insert trigger does
-- not notify in it; the producer wakes the queue after the commit (wake, store/_notifier.py).
INSERT INTO {schema}.jobs ({_job_columns}, idempotency_key, available_at)
SELECT {_job_columns}, idempotency_key, {_job_due}
FROM (SELECT set_config('forklift.quiet', 'on', true) AS quiet) AS marked,
     (VALUES ({_job_values})) AS j({_job_columns}, idempotency_key, run_at, delay)
WHERE marked.quiet = 'on'
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: job_insert_many
-- Insert many jobs (reserved ids, or NULL to draw one); taken keys insert nothing.
INSERT INTO {schema}.jobs (id, {_job_columns}, idempotency_key, available_at)
SELECT coalesce(id, nextval('{schema}.jobs_id_seq'::regclass)), {_job_columns},
       idempotency_key, {_job_due}
FROM unnest(%(id)s::bigint[], {_job_arrays})
    AS j(id, {_job_columns}, idempotency_key, run_at, delay)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, idempotency_key;

-- name: job_ids_by_key
-- The ids of existing jobs by idempotency key.
SELECT id, idempotency_key FROM {schema}.jobs
WHERE idempotency_key = ANY(%(keys)s::text[]);

-- name: job_insert_unique
-- Insert one unique job (forklift/unique.py), unless a live job holds its key or its
-- idempotency key is taken: then nothing. `quiet`: marked quiet first, as
-- job_insert_quiet (a CASE, so that a loud insert never marks its transaction).
INSERT INTO {schema}.jobs ({_job_columns}, idempotency_key, available_at, unique_key,
    unique_states)
SELECT {_job_columns}, idempotency_key, {_job_due}, {_unique_key}, unique_states
FROM (VALUES ({_job_values}, {_unique_values}))
    AS j({_job_columns}, idempotency_key, run_at, delay, {_unique_fields})
WHERE CASE WHEN %(quiet)s::boolean THEN set_config('forklift.quiet', 'on', true) = 'on'
           ELSE true END
ON CONFLICT DO NOTHING
RETURNING id, unique_key;

-- name: job_insert_replace
-- Insert one unique job, or give the ready job holding its key its arguments and due
-- time instead (_unique_replace): the id and stored key of the job inserted or
-- replaced; no row if a running job holds its key, or its idempotency key is taken.
-- `quiet`: as job_insert_unique's.
WITH j AS (
    SELECT j.*, {_unique_key} AS held_key
    FROM (VALUES ({_job_values}, {_unique_values}))
        AS j({_job_columns}, idempotency_key, run_at, delay, {_unique_fields})
    WHERE CASE WHEN %(quiet)s::boolean THEN set_config('forklift.quiet', 'on', true) = 'on'
               ELSE true END
), {_unique_replace};

-- name: job_insert_many_unique
-- job_insert_unique of many jobs (their keys distinct, in key order: _inserts.py): the
-- ids and keys of those inserted.
INSERT INTO {schema}.jobs ({_job_columns}, idempotency_key, available_at, unique_key,
    unique_states)
SELECT {_job_columns}, idempotency_key, {_job_due}, {_unique_key}, unique_states
FROM unnest({_job_arrays}, {_unique_arrays})
    AS j({_job_columns}, idempotency_key, run_at, delay, {_unique_fields})
ON CONFLICT DO NOTHING
RETURNING id, unique_key;

-- name: job_unique_holders
-- The jobs that held new jobs' unique keys when their inserts met them (their keys before
-- the period's number, with their periods, as `_unique_key` makes them), by key: the
-- newest job of each key, live still or just finished (jobs_unique_key_idx). Not only
-- the live ones: a holder that finished since is the answer all the same, and looking
-- again for a live one would insert a key again after later ones in the transaction,
-- out of the key order that keeps bulk enqueues from deadlocking.
SELECT h.id, j.unique_key
FROM unnest(%(unique_key)s::text[], %(unique_period)s::float8[]) AS j(unique_key, unique_period)
CROSS JOIN LATERAL (
    SELECT h.id FROM {schema}.jobs AS h
    WHERE h.unique_key = {_unique_key}
    ORDER BY h.id DESC LIMIT 1
) AS h;

-- name: job_ids_reserve
-- Reserve n job ids from the identity sequence (for COPY).
SELECT nextval('{schema}.jobs_id_seq'::regclass)
FROM generate_series(1, %(n)s::integer);

-- name: quiet
-- Mark the rest of this transaction's inserts quiet: a bulk enqueue on forklift's own
-- connection wakes its queues after the commit (wake), not in it.
SELECT set_config('forklift.quiet', 'on', true);

-- name: wake
-- Wake the workers of `queues` after a quiet enqueue committed: a transaction of its own
-- that does not wait for its commit record's flush (nothing in it needs to survive a
-- crash), so it holds PostgreSQL's notify lock for microseconds, not for a WAL flush.
SELECT set_config('synchronous_commit', 'off', true),
       (SELECT count(pg_notify('{channel}', q)) FROM unnest(%(queues)s::text[]) AS q);

-- name: job_copy
-- Bulk-load jobs that are due now and carry no idempotency key, with reserved ids.
COPY {schema}.jobs (id, {_job_columns}) FROM STDIN;

-- name: job_copy_unique
-- Bulk-load unique jobs (no idempotency key, none replacing), with reserved ids, their
-- due times and their keys as stored (the period's number drawn from job_clock's
-- reading): in a savepoint, for one of them meeting a live holder's key undoes them all
-- (_inserts.UniqueInserts).
COPY {schema}.jobs (id, {_job_columns}, available_at, unique_key, unique_states) FROM STDIN;

-- name: job_clock
-- The transaction's time on the database's clock, as a timestamp and as seconds since
-- the epoch (what `_unique_key` divides into periods).
SELECT now(), extract(epoch FROM now())::float8;

-- name: job_claim
-- Claim up to `limit` due jobs of the given queues for `owner`, in priority order, plus
-- (when `expired` is true) running jobs whose lease expired, their attempt recorded as
-- lost. One statement. The expiry scan is gated: workers ask for it now and then, not
-- on every claim, since it walks every running row. Paused queues are skipped, and so are
-- the jobs of limited tasks (a limit's key stored: the claim under limits takes them)
-- and those that require labels (job_claim_labelled takes them; a lost one is taken
-- back only by a worker with its labels: `labels`, _lease_expired).
-- It locks no job it does not take (a job locked here is one another claim skips): the
-- queues' lines are merged unlocked (`line`), then each queue's share of the first
-- `limit` is locked (`ready`, past what other claims hold), and what a queue could not
-- give, others' next in line give (`topped`).
WITH line AS (
    SELECT c.id, c.priority, c.available_at, q.name AS queue
    FROM unnest(%(queues)s::text[]) AS q(name),
    LATERAL (
        SELECT j.id, j.priority, j.available_at
        FROM {schema}.jobs j
        WHERE j.state = 'ready' AND j.limit_key IS NULL AND j.requires IS NULL
          AND j.queue = q.name AND j.available_at <= now()
        ORDER BY j.priority DESC, j.available_at, j.id
        LIMIT %(limit)s
    ) AS c
    WHERE q.name NOT IN (SELECT p.queue FROM {schema}.paused_queues AS p)
), expired AS (
    SELECT j.id, j.priority, j.available_at
    FROM {schema}.jobs j
    WHERE %(expired)s::boolean AND {_lease_expired}
    ORDER BY j.priority DESC, j.available_at, j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), share AS (
    -- Each queue's place among the first `limit` in line, the lost jobs counted in.
    SELECT f.queue, count(*) AS n FROM (
        SELECT l.queue, l.priority, l.available_at, l.id FROM line AS l
        UNION ALL SELECT NULL, e.priority, e.available_at, e.id FROM expired AS e
        ORDER BY priority DESC, available_at, id
        LIMIT %(limit)s
    ) AS f
    WHERE f.queue IS NOT NULL
    GROUP BY f.queue
), ready AS (
    SELECT c.id, c.priority, c.available_at
    FROM share AS s,
    LATERAL (
        SELECT j.id, j.priority, j.available_at
        FROM {schema}.jobs j
        WHERE j.state = 'ready' AND j.limit_key IS NULL AND j.requires IS NULL
          AND j.queue = s.queue AND j.available_at <= now()
        ORDER BY j.priority DESC, j.available_at, j.id
        LIMIT s.n
        FOR UPDATE SKIP LOCKED
    ) AS c
), topped AS (
    SELECT j.id, j.priority, j.available_at
    FROM {schema}.jobs j
    WHERE j.id = ANY(ARRAY(SELECT l.id FROM line AS l
                           WHERE l.id NOT IN (SELECT r.id FROM ready AS r)))
      AND j.state = 'ready' AND j.limit_key IS NULL AND j.requires IS NULL
      AND j.available_at <= now()
    ORDER BY j.priority DESC, j.available_at, j.id
    LIMIT (SELECT coalesce(sum(s.n), 0) FROM share AS s) - (SELECT count(*) FROM ready)
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT id FROM (SELECT * FROM expired UNION ALL SELECT * FROM ready
                    UNION ALL SELECT * FROM topped) AS p
    ORDER BY priority DESC, available_at, id
    LIMIT %(limit)s
)
{_take_picked};

-- name: job_claim_one
-- job_claim for the usual case, one queue and no expiry scan: the same jobs in the same
-- order, from a statement PostgreSQL plans in half the time. It plans a claim afresh on
-- every run (a generic plan knows no limit and scans a whole backlog: 22 ms a claim of
-- one among 1,000,000 ready jobs, against 0.5 ms), and job_claim's planning was half
-- the time an idle worker took to claim a new job (0.5 of 1.0 ms, fsync included).
--
-- The default priority's jobs are read from `floor` on (workers/claimer.py, Floors),
-- through an index of their own (jobs_ready_open_idx, migrations 0016, 0024 and 0026). Every job of
-- the queue claimed before leaves a dead version in the ready indexes, which no vacuum
-- can remove while another transaction holds the horizon back (an idle transaction, a
-- long report): a claim from the start of the line walks them all (35 ms a claim under
-- 120,000 of them, against 0.4 ms from the floor). Jobs of other priorities (their own
-- index, jobs_ready_open_ranked_idx), and a claim with no floor (NULL: a rewind), are read
-- from the start. The lines are read one after another, highest priority first, each
-- only as far as the limit still needs: a job locked here is one this claim takes.
-- Each row says where the next claim's floor may be (`floor`): the due time of the last
-- default-priority job it took, or, if it emptied the line, a second before its now()
-- (slack for jobs whose transactions are still committing). The statement returns one
-- row even when it took nothing, its job columns NULL.
-- A claim that did not fill also says, in a column of each row (`next_due`), when the
-- next job it could take falls due (as job_next_available: a job due now that it did
-- not take is another claim's, or under a limit; the jobs it took, which its snapshot
-- still sees ready, are due now too). The worker then sleeps until then without a
-- lookup of its own, which kept the GIL from the thread starting the job it had just
-- claimed (0.1 ms of a job's start). A claim that filled does not look. Nor does it
-- take fair jobs (store/fair.sql): one that emptied says whether any wait
-- (`fair_waiting`), and the worker claims them in turns at once.
WITH picked AS (
    SELECT * FROM (SELECT j.id, j.priority, j.available_at
     FROM {schema}.jobs j
     WHERE {_claimable} AND j.priority > 0
     ORDER BY j.priority DESC, j.available_at, j.id
     LIMIT %(limit)s
     FOR UPDATE SKIP LOCKED) AS higher
    UNION ALL
    SELECT * FROM (SELECT j.id, j.priority, j.available_at
     FROM {schema}.jobs j
     WHERE {_claimable} AND j.priority = 0
       AND j.available_at >= coalesce(%(floor)s::timestamptz, '-infinity')
     ORDER BY j.available_at, j.id
     LIMIT %(limit)s
     FOR UPDATE SKIP LOCKED) AS usual
    UNION ALL
    SELECT * FROM (SELECT j.id, j.priority, j.available_at
     FROM {schema}.jobs j
     WHERE {_claimable} AND j.priority < 0
     ORDER BY j.priority DESC, j.available_at, j.id
     LIMIT %(limit)s
     FOR UPDATE SKIP LOCKED) AS lower
    LIMIT %(limit)s
), taken AS (
    UPDATE {schema}.jobs AS j SET
        {_lease_taken},
        started_at = now()
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked)) AND {_claim_commit}
    RETURNING {_claimed}
), emptied AS (
    SELECT (SELECT count(*) FROM picked) < %(limit)s AS emptied
)
SELECT t.*,
    CASE WHEN e.emptied THEN (
        SELECT extract(epoch FROM n.available_at - now())::float8
        FROM {schema}.jobs AS n
        WHERE n.state = 'ready' AND n.limit_key IS NULL AND n.queue = %(queue)s::text
          AND n.available_at > now()
        ORDER BY n.available_at
        LIMIT 1
    ) END AS next_due,
    e.emptied AND (SELECT {_fair_waiting} FROM (SELECT %(queue)s::text AS name) AS q)
        AS fair_waiting,
    CASE WHEN e.emptied THEN greatest(%(floor)s::timestamptz, now() - interval '1 second')
        ELSE coalesce((SELECT least(max(p.available_at), now() - interval '1 second')
                       FROM picked AS p WHERE p.priority = 0 HAVING count(*) > 0),
                      %(floor)s::timestamptz)
    END AS floor
FROM emptied AS e LEFT JOIN taken AS t ON true;

-- name: job_claim_labelled
-- The claim of a worker with labels (forklift run --labels), made before its plain one:
-- up to `limit` due jobs of the given queues that require labels (a task's `requires`,
-- jobs.requires: migration 0025) the worker has every one of, in priority then due
-- order, plus (when `expired`) such jobs lost with their workers (`labels`: the
-- worker's). Those jobs wait for a worker that can run them, so a worker that can takes
-- them before jobs any worker may take; no other claim takes them. They are read
-- through jobs_ready_labelled_idx (migration 0026), by queue and by the labels they
-- require: one probe for each queue and each set of the worker's labels (`sets`, as
-- jobs.requires holds them: sorted, joined by commas; Claimer.label_sets), so jobs that
-- require labels it lacks are never read, and every plan is the index's order. Each
-- probe locks what it reads past other claims' locks; what the merge leaves is unlocked
-- at the commit.
WITH line AS (
    SELECT c.id, c.priority, c.available_at
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN unnest(%(sets)s::text[]) AS l(requires),
    LATERAL (
        SELECT j.id, j.priority, j.available_at
        FROM {schema}.jobs j
        WHERE j.state = 'ready' AND j.queue = q.name AND j.requires = l.requires
          AND j.available_at <= now()
        ORDER BY j.priority DESC, j.available_at, j.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE q.name NOT IN (SELECT p.queue FROM {schema}.paused_queues AS p)
), expired AS (
    SELECT j.id, j.priority, j.available_at
    FROM {schema}.jobs j
    WHERE %(expired)s::boolean AND j.requires IS NOT NULL AND {_lease_expired}
    ORDER BY j.priority DESC, j.available_at, j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT id FROM (SELECT * FROM expired UNION ALL SELECT * FROM line) AS p
    ORDER BY priority DESC, available_at, id
    LIMIT %(limit)s
)
{_take_picked};

-- name: job_next_available
-- Seconds until the next job a plain claim of the given queues could take falls due,
-- paused queues left out (database clock; no row: none). Only jobs due after the claim
-- this follows, `since` seconds ago (the worker's clock): one due by then that the claim
-- did not take was another claim's or under a limit (not the plain claim's), and
-- answering "now" for it would have the worker claim and look again without end.
-- Through jobs_ready_due_idx, one probe per queue whatever other queues hold.
SELECT greatest(0, extract(epoch FROM f.available_at - now()))::float8
FROM unnest(%(queues)s::text[]) AS q(name),
LATERAL (
    SELECT j.available_at FROM {schema}.jobs j
    WHERE j.state = 'ready' AND j.limit_key IS NULL AND j.queue = q.name
      AND j.available_at > now() - make_interval(secs => %(since)s::float8)
    ORDER BY j.available_at
    LIMIT 1
) AS f
WHERE q.name NOT IN (SELECT p.queue FROM {schema}.paused_queues AS p)
ORDER BY f.available_at
LIMIT 1;

-- name: lease_renew_many
-- Extend the leases `owner` still holds; returns the ids renewed (missing ones are lost).
-- Those among `seen` (the jobs whose handlers were called) are seen running from now on:
-- a lost lease charges them (_forgivable).
WITH mine AS (
    SELECT j.id
    FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS h(id, attempt),
    {_held_lease}
)
UPDATE {schema}.jobs AS j SET
    lease_until = now() + make_interval(secs => %(lease)s::float8),
    seen_running = j.seen_running OR j.id = ANY(%(seen)s::bigint[])
WHERE j.id = ANY(ARRAY(SELECT id FROM mine))
RETURNING j.id;

-- name: job_complete_many
-- Mark jobs succeeded, fenced by owner and attempt; returns the ids completed. A job
-- someone waits for (app.result()) notifies the waiters' channel. For jobs with no
-- result and no progress to write: the group commit of plain jobs, the common case.
-- A success clears the job's checkpoint: there is nothing left to resume.
WITH mine AS (
    SELECT j.id
    FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS h(id, attempt),
    {_held_lease}
)
UPDATE {schema}.jobs AS j SET
    state = 'succeeded', completed_at = now(), ran_by = j.lease_owner, lease_owner = NULL,
    lease_until = NULL, checkpoint = NULL, checkpoint_at = NULL
WHERE j.id = ANY(ARRAY(SELECT id FROM mine))
RETURNING j.id, CASE WHEN j.waited THEN pg_notify('{done_channel}', 'j' || j.id) END;

-- name: job_complete_many_values
-- The same, writing each job's result (NULL: none) and its last progress not yet
-- written (NULL: none) with it.
WITH mine AS (
    SELECT j.id, h.result, h.progress
    FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(results)s::jsonb[],
                %(progress)s::jsonb[])
      AS h(id, attempt, result, progress),
    {_held_lease}
)
UPDATE {schema}.jobs AS j SET
    state = 'succeeded', completed_at = now(), ran_by = j.lease_owner, lease_owner = NULL,
    lease_until = NULL, checkpoint = NULL, checkpoint_at = NULL,
    result = mine.result,
    progress = coalesce(mine.progress || jsonb_build_object('at', now()), j.progress)
FROM mine
WHERE j.id = mine.id
RETURNING j.id, CASE WHEN j.waited THEN pg_notify('{done_channel}', 'j' || j.id) END;

-- name: effect_limits
-- How long this effect transaction may sit idle while its handler works, and how long
-- one of the handler's statements may take (SET LOCAL: for this transaction only; the
-- session keeps its own, shorter, bounds for the worker's statements). NULL: unchanged.
SELECT set_config('idle_in_transaction_session_timeout',
                  coalesce(%(idle_ms)s::text,
                           current_setting('idle_in_transaction_session_timeout')), true),
       set_config('statement_timeout',
                  coalesce(%(statement_ms)s::text, current_setting('statement_timeout')), true);

-- name: effect_limits_end
-- The worker's own statement bound again, for the completion that ends the effect
-- transaction (RESET: the session's value, which is what it keeps after the transaction).
RESET statement_timeout;

-- name: job_fail
-- Record a failed attempt: back to ready after `delay` seconds, or dead; fenced. A retry
-- wakes idle workers so they sleep until it is due, not for their poll interval; a death
-- tells the job's waiters. Returns the new state.
WITH failed AS (
    UPDATE {schema}.jobs SET
        state = CASE WHEN %(dead)s::boolean THEN 'dead' ELSE 'ready' END::{schema}.job_state,
        available_at = CASE WHEN %(dead)s::boolean THEN available_at
            ELSE now() + make_interval(secs => %(delay)s::float8) END,
        completed_at = CASE WHEN %(dead)s::boolean THEN now() END,
        lease_owner = NULL,
        lease_until = NULL,
        last_error = %(error)s::text,
        errors = errors || jsonb_build_object(
            'attempt', attempts, 'at', now(), 'worker', %(owner)s::text,
            'error', %(error)s::text, 'traceback', %(traceback)s::text)
    WHERE id = %(id)s::bigint AND attempts = %(attempt)s::integer
      AND state = 'running' AND lease_owner = %(owner)s::text
    RETURNING id, state::text AS state, queue, waited
)
SELECT state, CASE WHEN state = 'ready' THEN pg_notify('{channel}', queue) END IS NULL,
       CASE WHEN state = 'dead' AND waited THEN pg_notify('{done_channel}', 'j' || id) END IS NULL
FROM failed;

-- name: _release_mine
-- A fragment, not a query: the rows of the CTE `mine` (locked in id order) go back to
-- ready, their attempt not counted, and their queues' workers are woken; their ids.
released AS (
    UPDATE {schema}.jobs AS j SET
        state = 'ready', attempts = j.attempts - 1, lease_owner = NULL, lease_until = NULL
    WHERE j.id = ANY(ARRAY(SELECT id FROM mine))
    RETURNING j.id, j.queue
), woken AS (
    SELECT count(pg_notify('{channel}', q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM released) AS q
)
SELECT released.id FROM released, woken

-- name: job_release_requiring
-- Give jobs back as job_release_many does, each storing the labels its task requires
-- (`requires`, one per job, sorted and joined by commas), which its producer did not
-- store (it did not declare the task): the worker that claimed it lacks them, and from
-- now on only a worker that has them claims it (job_claim_labelled).
WITH mine AS (
    SELECT j.id
    FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS h(id, attempt),
    {_held_lease}
), released AS (
    UPDATE {schema}.jobs AS j SET
        state = 'ready', attempts = j.attempts - 1, lease_owner = NULL, lease_until = NULL,
        requires = r.requires
    FROM unnest(%(ids)s::bigint[], %(requires)s::text[]) AS r(id, requires)
    WHERE j.id = r.id AND j.id = ANY(ARRAY(SELECT id FROM mine))
    RETURNING j.id, j.queue
), woken AS (
    SELECT count(pg_notify('{channel}', q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM released) AS q
)
SELECT released.id FROM released, woken;

-- name: job_release_many
-- Give jobs back (graceful stop, or claimed ahead and not started in time): ready at
-- once, in their place in line (their due time unchanged: it has passed), attempt not
-- counted; fenced. Wakes workers.
-- Rows are locked in id order, as every other write over many jobs locks them (renewal,
-- completion, an operator's cancel): in any other order two of them could deadlock.
WITH mine AS (
    SELECT j.id
    FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS h(id, attempt),
    {_held_lease}
), {_release_mine};

-- name: job_snooze_many
-- Give jobs back to run again later (forklift.Snooze): ready at now() + their `delays`
-- (database clock), their attempt not counted but a snooze counted instead; fenced. Only
-- those with fewer snoozes than their `bounds` (the task's max_snoozes): the others stay
-- running, for the worker to record as failed attempts. Each lease's id, whether it
-- snoozed, and its snoozes before this one. Wakes workers, so an idle one sleeps until
-- the job is due, not for its poll interval. Rows in id order, as every write over many.
WITH mine AS (
    SELECT j.id, h.delay, h.bound
    FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(delays)s::float8[],
                %(bounds)s::integer[])
      AS h(id, attempt, delay, bound),
    {_held_lease}
), snoozed AS (
    UPDATE {schema}.jobs AS j SET
        state = 'ready', attempts = j.attempts - 1, lease_owner = NULL, lease_until = NULL,
        available_at = now() + make_interval(secs => mine.delay),
        snoozes = j.snoozes + 1, snoozed_at = now()
    FROM mine
    WHERE j.id = mine.id AND j.snoozes < mine.bound
    RETURNING j.id, j.queue
), woken AS (
    SELECT count(pg_notify('{channel}', q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM snoozed) AS q
)
SELECT mine.id, snoozed.id IS NOT NULL AS snoozed, j.snoozes
FROM mine CROSS JOIN woken
JOIN {schema}.jobs AS j ON j.id = mine.id
LEFT JOIN snoozed ON snoozed.id = mine.id
ORDER BY mine.id;

-- name: job_rescue_exhausted
-- Expired leases with no attempts left go dead (lost to a vanished worker; a worker
-- whose liveness lock is held again after an outage keeps its jobs). One whose last
-- attempt is forgiven (_forgivable) is left to a claim, which gives it one more.
UPDATE {schema}.jobs AS j SET
    state = 'dead', completed_at = now(), lease_owner = NULL, lease_until = NULL,
    last_error = 'LeaseExpired: lease of ' || j.lease_owner || ' expired, no attempts left',
    errors = j.errors || jsonb_build_object(
        'attempt', j.attempts, 'at', now(), 'worker', j.lease_owner,
        'error', 'LeaseExpired: lease of ' || j.lease_owner || ' expired, no attempts left')
WHERE j.id IN (
    SELECT j.id FROM {schema}.jobs AS j
    WHERE j.state = 'running' AND j.lease_until < now() AND j.attempts >= j.max_attempts
      AND NOT {_forgivable} AND NOT {_owner_vouched}
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
)
RETURNING j.id;

-- name: job_progress_many
-- Record how far running jobs are, fenced by owner and attempt (a job that ended meanwhile
-- keeps what it had). Rows in id order, as every write over many jobs.
WITH mine AS (
    SELECT j.id, h.progress
    FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(progress)s::jsonb[])
      AS h(id, attempt, progress),
    {_held_lease}
)
UPDATE {schema}.jobs AS j
SET progress = mine.progress || jsonb_build_object('at', now())
FROM mine
WHERE j.id = mine.id;

-- name: job_checkpoint_many
-- Record the checkpoints of running jobs (workers/checkpoints.py), fenced by owner and
-- attempt like a completion: a worker that lost its lease never writes over its next
-- owner's. Each lands only over an older version (or none), so a write sent before a
-- newer one (the periodic writer racing the handler's own) never undoes it; the ids of
-- the jobs still ours. Rows in id order, as every write over many jobs.
WITH mine AS (
    SELECT j.id, h.checkpoint
    FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(checkpoints)s::jsonb[])
      AS h(id, attempt, checkpoint),
    {_held_lease}
)
UPDATE {schema}.jobs AS j SET
    checkpoint = CASE WHEN j.checkpoint IS NULL
        OR (mine.checkpoint->>'v')::bigint > (j.checkpoint->>'v')::bigint
        THEN mine.checkpoint ELSE j.checkpoint END,
    checkpoint_at = CASE WHEN j.checkpoint IS NULL
        OR (mine.checkpoint->>'v')::bigint > (j.checkpoint->>'v')::bigint
        THEN now() ELSE j.checkpoint_at END
FROM mine
WHERE j.id = mine.id
RETURNING j.id;

-- name: job_checkpoint
-- A job's checkpoint and its age in seconds (database clock); no row: no such job.
SELECT checkpoint, extract(epoch FROM now() - checkpoint_at)::float8 AS age
FROM {schema}.jobs WHERE id = %(id)s::bigint;

-- name: limit_windows_prune
-- Forget rate windows whose every start has slid out (keys not started for `per`).
DELETE FROM {schema}.limit_windows AS w
USING {schema}.limits AS l
WHERE l.id = w.limit_id
  AND (w.newest + 101) * (l.per / 100) < extract(epoch FROM clock_timestamp());

-- name: job_prune
-- Delete finished jobs past their retention, a bounded batch at a time; a job of a batch
-- that holds its jobs (not finished, or its callback not: batch_holds, migration 0012)
-- stays, as `forklift jobs purge` leaves it.
DELETE FROM {schema}.jobs
WHERE id IN (
    SELECT j.id FROM {schema}.jobs AS j
    WHERE ((j.state IN ('succeeded', 'cancelled')
            AND j.completed_at < now() - make_interval(secs => %(keep_finished)s::float8))
        OR (j.state = 'dead'
            AND j.completed_at < now() - make_interval(secs => %(keep_dead)s::float8)))
      AND (j.batch_id IS NULL OR NOT {schema}.batch_holds(j.batch_id))
      AND (j.workflow_id IS NULL OR NOT {schema}.workflow_holds(j.workflow_id))
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
);

-- name: channel_listen
-- Hear of ready jobs: every notification on the channel names a queue.
LISTEN "{channel}";

-- name: control_listen
-- Hear operators' orders (`cancel <job id> <attempt>`), on a channel of their own.
LISTEN "{control_channel}";

-- name: job_succeeded_among
-- Which of these (id, attempt) leases ended succeeded at that attempt: how a worker
-- whose completion was sent and its answer lost (the connection dropped) learns whether
-- it committed. A job completes once per attempt: an attempt that succeeded is ours.
SELECT j.id FROM {schema}.jobs AS j
JOIN unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS h(id, attempt)
  ON j.id = h.id AND j.attempts = h.attempt
WHERE j.state = 'succeeded' AND j.id = ANY(%(ids)s::bigint[]);

-- name: job_release_unknown
-- Give back the jobs `owner` holds that it does not know of (not among `known`): a
-- claim whose answer was lost with its connection may have committed. Ready at once,
-- attempt not counted, as job_release_many; rows locked in id order. Wakes workers.
WITH mine AS (
    SELECT j.id FROM {schema}.jobs AS j
    WHERE j.lease_owner = %(owner)s::text AND j.state = 'running'
      AND j.id <> ALL(%(known)s::bigint[])
    ORDER BY j.id
    FOR UPDATE
), {_release_mine};

-- name: job_cancelled_among
-- Which of these (id, attempt) leases an operator took by cancelling the job: how the
-- lease renewer tells a cancel whose notification it missed from a lease lost.
-- (The ids again as `= ANY`: the cancelled jobs among them by index, whatever the plan,
-- before any join with the leases.)
SELECT j.id FROM {schema}.jobs AS j
JOIN unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS h(id, attempt)
  ON j.id = h.id AND j.attempts = h.attempt
WHERE j.state = 'cancelled' AND j.id = ANY(%(ids)s::bigint[]);

-- name: jobs_owned
-- Whether this role owns the jobs table (or is a member of its owner): who may VACUUM it.
SELECT pg_has_role(current_user, c.relowner, 'USAGE')
FROM pg_class AS c WHERE c.oid = '{schema}.jobs'::regclass;

-- name: jobs_vacuum_due
-- Whether the jobs table's dead tuples passed autovacuum's own threshold for it (the
-- table's settings: 1,000 + 1 % of its rows), as the statistics say; and the horizon:
-- the oldest transaction id that a session of this database (or a walsender), a
-- prepared transaction or a replication slot still holds, widened to 64 bits against
-- the next id. VACUUM removes no version that a transaction at or after the horizon
-- deleted: while it stands still, a VACUUM finds nothing the last one left.
WITH next AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS id),
held AS (
    SELECT x.xid FROM pg_stat_activity AS a,
        LATERAL (VALUES (a.backend_xid), (a.backend_xmin)) AS x(xid)
    WHERE a.datid IS NULL
       OR a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
    UNION ALL SELECT transaction FROM pg_prepared_xacts
    UNION ALL SELECT xmin FROM pg_replication_slots
)
SELECT coalesce((SELECT n_dead_tup > 1000 + 0.01 * n_live_tup FROM pg_stat_user_tables
                 WHERE relid = '{schema}.jobs'::regclass), false) AS due,
       least(next.id, min(next.id - mod(mod(next.id, 4294967296)
                                        - held.xid::text::bigint + 4294967296, 4294967296)))
           AS horizon
FROM next LEFT JOIN held ON held.xid IS NOT NULL
GROUP BY next.id;

-- name: jobs_vacuum
-- Reclaim the dead tuples of the hot table (and refresh the planner's statistics);
-- skip, not wait, if autovacuum or another VACUUM has it.
VACUUM (SKIP_LOCKED, ANALYZE) {schema}.jobs;

-- name: job_trace_contexts
-- The W3C trace contexts stored with the given jobs at enqueue (forklift[otel]), for the
-- spans of their attempts; jobs enqueued without one are left out.
SELECT id, trace_context FROM {schema}.jobs
WHERE id = ANY(%(ids)s::bigint[]) AND trace_context IS NOT NULL;
