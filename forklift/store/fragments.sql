-- Fragments the store's query files share (queries.sql, limits.sql, batches.sql, fair.sql),
-- and the scheduler's, which inserts jobs too: each `{_name}` in their queries becomes the text
-- of the section of that name here (_sql.load).

-- name: _owner_vouched
-- A fragment, not a query: whether the lease owner of job `j`, whose lease ran out, is a
-- live worker that was cut off for longer than its lease (an outage) and is back: the
-- liveness lock that vouches for it (its supervisor's for a child,
-- `host:pid:nonce@spid.snonce`, else its own: _ids.liveness_holder) is held by a session
-- that began after the lease ran out, under a minute ago. Its renewer takes the lease
-- back within a third of the lease, so meanwhile the job is neither re-run nor
-- dead-lettered. A lock held since before the lease ran out
-- vouches for nothing: that owner was not cut off but froze or wedged (SIGSTOP), and its
-- lease expires as ever. The lock's key is _locks.lock_key's: the first 63 bits of the
-- SHA-256 of `forklift:liveness:<schema>:<holder>`. A lease that ran out while the server
-- was down (a second or more before it started) counts as vouched for in the server's
-- first 5 s: every session began anew, and a live supervisor whose session is back a
-- moment after a peer's (a slow connect) must not lose its workers' jobs to that peer.
-- Asked only of rows whose lease already ran out: its cost puts it after every cheaper
-- test. (The sessions' start times are read from pg_stat_activity: forklift's processes
-- share one role, whose sessions' columns every one of them may read.)
((j.lease_until < pg_postmaster_start_time() - interval '1 second'
      AND now() < pg_postmaster_start_time() + interval '5 seconds')
  OR EXISTS (
    SELECT 1 FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND ((l.classid::bigint << 32) | l.objid::bigint) = (('x' || left(encode(sha256(convert_to(
            'forklift:liveness:' || btrim('{schema}', '"') || ':' || CASE
                WHEN strpos(j.lease_owner, '@') = 0 THEN j.lease_owner
                ELSE split_part(j.lease_owner, ':', 1) || ':'
                     || replace(split_part(j.lease_owner, '@', 2), '.', ':') END,
            'UTF8')), 'hex'), 16))::bit(64) >> 1)::bigint
      AND a.backend_start > j.lease_until
      AND a.backend_start > now() - interval '60 seconds'))

-- name: _claim_commit
-- A fragment: how a claim's commit waits. A claim on its own (`%(alone)s`) commits
-- without waiting for its WAL flush (synchronous_commit off for its transaction only):
-- nothing in it needs to survive a database crash. If one is lost, its jobs are ready
-- again with the attempt uncounted; a handler already started for one of them can
-- complete nothing (its completion is fenced by the lease the crash took back, and
-- any effect rolls back with it), and the job runs again: at-least-once, each effect
-- once. A WAL flush is sequential, so any later commit that waits (a completion)
-- makes the claim durable too. A claim that carries completions waits as they must.
-- It took a sixth of an idle worker's claim here (0.1 of 0.6 ms), far more on disks
-- slower to flush.
(SELECT set_config('synchronous_commit',
    CASE WHEN %(alone)s::boolean THEN 'off' ELSE current_setting('synchronous_commit') END,
    true)) IS NOT NULL

-- name: _fair_waiting
-- A fragment: whether fair jobs wait, due, in queue `q`: one holding a turn (all of those
-- are due: migration 0023), or one without a turn, due.
(EXISTS (SELECT 1 FROM {schema}.jobs AS f
         WHERE f.state = 'ready' AND f.limit_key IS NULL AND f.fair_key IS NOT NULL
           AND f.fair_turn IS NOT NULL AND f.queue = q.name)
 OR EXISTS (SELECT 1 FROM {schema}.jobs AS f
            WHERE f.state = 'ready' AND f.limit_key IS NULL AND f.fair_key IS NOT NULL
              AND f.fair_turn IS NULL AND f.queue = q.name AND f.available_at <= now()))

-- name: _claimed
-- The columns of a claimed job, every claim's (RETURNING), named as ClaimedJob's fields
-- (_rows.claimed): a claimed column is added here and there only.
j.id, j.queue, j.task, j.args, j.idempotency_key, j.priority, j.attempts AS attempt,
    j.max_attempts, j.timeout,
    greatest(0, extract(epoch FROM now() - j.available_at))::float8 AS wait, j.batch_id,
    j.workflow_id

-- name: _forgivable
-- Whether running job `j`'s attempt, lost with its worker, is forgiven rather than
-- charged: its handler was never seen running (the owner's lease renewal says which ran:
-- seen_running), and fewer than 3 of its attempts were forgiven so far (a job that takes
-- its host down before its first renewal is charged from the fourth time on). A job
-- claimed ahead of a slot, lost with its host before it started, is innocent.
(NOT j.seen_running AND j.leases_forgiven < 3)

-- name: _lease_expired
-- Whether running job `j` is a lost one a claim of these queues (`queues`), by a worker
-- with these labels (`labels`), may take back: its lease ran out, its queue is not
-- paused, it has attempts left (or this one is forgiven), the worker has every label it
-- requires, and no live owner vouches for it (_owner_vouched, the costliest test, asked
-- last). A lost job keeps its place in line: its original due time, not its lease's end.
j.state = 'running' AND j.lease_until < now()
      AND j.queue NOT IN (SELECT p.queue FROM {schema}.paused_queues AS p)
      AND (j.attempts < j.max_attempts OR {_forgivable}) AND j.queue = ANY(%(queues)s::text[])
      AND (j.requires IS NULL OR string_to_array(j.requires, ',') <@ %(labels)s::text[])
      AND NOT {_owner_vouched}

-- name: _claimable
-- Whether job `j` is one job_claim_one may take: ready and due in its queue, not a
-- limited task's, not a fair one (taken in turns: store/fair.sql), not one that requires
-- labels (job_claim_labelled), the queue not paused.
j.state = 'ready' AND j.limit_key IS NULL AND j.fair_key IS NULL AND j.requires IS NULL
      AND j.queue = %(queue)s::text AND j.available_at <= now()
      AND NOT EXISTS (SELECT FROM {schema}.paused_queues AS p WHERE p.queue = %(queue)s::text)

-- name: _lease_taken
-- What a claim sets on the job `j` it takes (UPDATE ... SET): running, one more attempt
-- (the attempt number fences every write of the run), its lease `owner`'s for `lease`
-- seconds, not seen running yet. A job taken back from a lost lease whose handler was
-- never seen running (_forgivable) is given that attempt back: one more allowed.
state = 'running',
    attempts = j.attempts + 1,
    max_attempts = j.max_attempts
        + CASE WHEN j.state = 'running' AND {_forgivable} THEN 1 ELSE 0 END,
    leases_forgiven = j.leases_forgiven
        + CASE WHEN j.state = 'running' AND {_forgivable} THEN 1 ELSE 0 END,
    seen_running = false,
    lease_owner = %(owner)s::text,
    lease_until = now() + make_interval(secs => %(lease)s::float8)

-- name: _take_picked
-- A fragment: the end of a claim whose CTE `picked` holds the ids of the jobs it takes,
-- ready ones and lost ones (still `running`, their lease run out): each taken for
-- `owner` (_lease_taken), a lost one's attempt recorded (_lease_lost); their columns.
UPDATE {schema}.jobs AS j SET
    {_lease_taken},
    started_at = now(),
    {_lease_lost}
WHERE j.id = ANY(ARRAY(SELECT id FROM picked)) AND {_claim_commit}
RETURNING {_claimed}

-- name: _lease_lost
-- What a claim sets on a job it takes back from an expired lease (still `running` as it
-- is taken; UPDATE ... SET): the lost attempt recorded as its last error and among its
-- errors, said to be forgiven when it is (_lease_taken). A ready job's are left as they
-- are.
last_error = CASE WHEN j.state = 'running' THEN {_lease_lost_error} ELSE j.last_error END,
    errors = CASE WHEN j.state = 'running'
        THEN j.errors || jsonb_build_object(
            'attempt', j.attempts, 'at', now(), 'worker', j.lease_owner,
            'error', {_lease_lost_error})
        ELSE j.errors END

-- name: _forgiven_note
-- What a forgiven attempt of job `j` adds to the error it records (a lost lease's, a
-- vanished host's): the words bench.interactions looks for ("not charged"); 3 is
-- _forgivable's bound.
'before its handler was seen running: not charged (an attempt added, '
    || (j.leases_forgiven + 1) || ' of 3 forgiven)'

-- name: _lease_lost_error
-- The error a lost lease of running job `j` records.
'LeaseExpired: lease of ' || j.lease_owner || ' expired'
    || CASE WHEN {_forgivable} THEN ' ' || {_forgiven_note} ELSE '' END

-- name: _job_columns
-- A fragment: the columns a new job's row takes from its producer as they are (every one
-- but its id, idempotency key and due time), in the order of _inserts.COLUMNS: the rows
-- job_copy writes, and the names every insert of a job selects them by.
queue, task, args, priority, max_attempts, max_crashes, timeout, batch_id, limit_key,
trace_context, fair_key, fair_weight, requires

-- name: _job_arrays
-- A fragment: new jobs as parameters, one array per field of _inserts.FIELDS: those of
-- _job_columns, then idempotency_key, run_at and delay, which every insert of many
-- unnests `AS j(<_job_columns>, idempotency_key, run_at, delay)`.
%(queue)s::text[], %(task)s::text[], %(args)s::jsonb[], %(priority)s::smallint[],
%(max_attempts)s::integer[], %(max_crashes)s::integer[], %(timeout)s::float8[],
%(batch_id)s::bigint[], %(limit_key)s::text[], %(trace_context)s::jsonb[],
%(fair_key)s::text[], %(fair_weight)s::real[], %(requires)s::text[],
%(idempotency_key)s::text[], %(run_at)s::timestamptz[], %(delay)s::float8[]

-- name: _job_values
-- A fragment: one new job as parameters, the fields of _job_arrays one by one, for an
-- insert of one job `FROM (VALUES ({_job_values})) AS j(...)` (cheaper than unnesting
-- one-element arrays, on the path of every single enqueue).
%(queue)s::text, %(task)s::text, %(args)s::jsonb, %(priority)s::smallint,
%(max_attempts)s::integer, %(max_crashes)s::integer, %(timeout)s::float8,
%(batch_id)s::bigint, %(limit_key)s::text, %(trace_context)s::jsonb,
%(fair_key)s::text, %(fair_weight)s::real, %(requires)s::text,
%(idempotency_key)s::text, %(run_at)s::timestamptz, %(delay)s::float8

-- name: _job_due
-- A fragment: when the new job `j` is due, on the database's clock.
coalesce(j.run_at, now()) + make_interval(secs => j.delay)

-- name: _unique_fields
-- A fragment: a unique job's fields (forklift/unique.py), after those of _job_arrays or
-- _job_values in a unique insert's parameters (_inserts.UNIQUE_FIELDS): its key before
-- the period's number, its period (seconds, or NULL) and its states (a bitmask).
unique_key, unique_period, unique_states

-- name: _unique_arrays
-- A fragment: _unique_fields as arrays, one element per new job (after _job_arrays).
%(unique_key)s::text[], %(unique_period)s::float8[], %(unique_states)s::smallint[]

-- name: _unique_values
-- A fragment: _unique_fields of one new job (after _job_values).
%(unique_key)s::text, %(unique_period)s::float8, %(unique_states)s::smallint

-- name: _unique_key
-- A fragment: the unique key new job `j` is stored under: its key, then, with a period,
-- `@` and the number of the period the database's clock is in (the transaction's start),
-- so that producers whose clocks disagree agree on it.
j.unique_key || CASE WHEN j.unique_period IS NULL THEN ''
    ELSE '@' || floor(extract(epoch FROM now())::float8 / j.unique_period)::bigint END

-- name: _unique_replace
-- A fragment: the rest of job_insert_replace after its CTE `j` of one new job (its
-- fields, and `held_key`: the key it is stored under, _unique_key). If a ready job holds
-- the key, it is given the new job's arguments (and the limit key drawn from them), due
-- time, priority and trace (a debounce); else the new job is inserted unless a live job
-- holds the key. Only a ready holder is locked, never a running one: a worker's writes
-- to its jobs never wait for a producer's transaction. One job a statement: the holder's
-- lock comes before the insert, so two keys in one statement could be taken out of key
-- order (the order that keeps bulk enqueues from deadlocking: _inserts.UniqueInserts).
-- A holder made due now wakes its queue's workers (an insert's trigger wakes them for a
-- new job; an update wakes no one). Its fair key and weight follow its new arguments;
-- it keeps its turn unless it is due later now (migration 0023 takes that).
target AS (
    SELECT t.id, j.held_key, j.args, {_job_due} AS due, j.priority, j.limit_key,
           j.trace_context, j.fair_key, j.fair_weight, j.requires
    FROM j JOIN {schema}.jobs AS t
        ON t.unique_key = j.held_key AND {schema}.unique_holds(t.state, t.unique_states)
    WHERE t.state = 'ready'
    FOR UPDATE OF t
), replaced AS (
    UPDATE {schema}.jobs AS t SET
        args = r.args, available_at = r.due, priority = r.priority, limit_key = r.limit_key,
        trace_context = r.trace_context, fair_key = r.fair_key, fair_weight = r.fair_weight,
        requires = r.requires
    FROM target AS r
    WHERE t.id = r.id AND t.state = 'ready'
    RETURNING t.id, t.unique_key, t.queue, t.available_at
), woke AS (
    SELECT pg_notify('{channel}', r.queue) FROM replaced AS r WHERE r.available_at <= now()
), inserted AS (
    INSERT INTO {schema}.jobs AS t ({_job_columns}, idempotency_key, available_at,
        unique_key, unique_states)
    SELECT {_job_columns}, idempotency_key, {_job_due}, held_key, unique_states
    FROM j
    WHERE NOT EXISTS (SELECT 1 FROM target)
    ON CONFLICT DO NOTHING
    RETURNING t.id, t.unique_key
)
SELECT id, unique_key FROM replaced
WHERE (SELECT count(*) FROM woke) >= 0  -- (read, so that woke runs)
UNION ALL
SELECT id, unique_key FROM inserted
