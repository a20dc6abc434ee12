-- The supervisor's queries. Each starts with `-- name: <name>` and a description;
-- {schema} is replaced by the quoted schema name when loaded, {channel} by the
-- notification channel idle workers listen on.

-- name: job_held_by_owner
-- The running jobs a (dead or killed) worker process holds, all or just %(ids)s: their
-- ids and attempts, locked until the transaction that charges them ends. With
-- %(unlocked)s, none unless the owner's liveness lock (%(key)s) is free at this moment.
SELECT j.id, j.attempts FROM {schema}.jobs AS j
WHERE j.state = 'running' AND j.lease_owner = %(owner)s::text
  AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
  AND NOT (%(unlocked)s::boolean AND EXISTS (
      SELECT 1 FROM pg_locks AS l
      WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
        AND l.classid::bigint = (%(key)s::bigint >> 32)
        AND l.objid::bigint = (%(key)s::bigint & 4294967295)))
ORDER BY j.id
FOR UPDATE;

-- name: job_running_owners
-- The lease owners of running jobs, by a loose scan of the partial index on running rows
-- (a probe per owner), backward: while another transaction holds the horizon, every job
-- that ran leaves a dead entry there, and an owner's newest entries, read first, are the
-- ones likely still running. (DISTINCT read every entry, dead or not.)
WITH RECURSIVE owners(owner) AS (
    (SELECT j.lease_owner FROM {schema}.jobs AS j WHERE j.state = 'running'
     ORDER BY j.lease_owner DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT j.lease_owner FROM {schema}.jobs AS j
            WHERE j.state = 'running' AND j.lease_owner < o.owner
            ORDER BY j.lease_owner DESC LIMIT 1)
    FROM owners AS o WHERE o.owner IS NOT NULL
)
SELECT owner FROM owners WHERE owner IS NOT NULL;

-- name: job_fail_orphaned
-- Record a dead (or killed) worker process on the jobs it held: ready again after the
-- given per-job delay (a NULL delay: at once, in its old place in line), or dead when
-- attempts are exhausted. With `crash` (its run killed or wedged the worker; a timeout
-- is no crash) the job is charged a crash too, and at max_crashes it is quarantined:
-- dead, whatever attempts are left, and its error says why. With `forgive` (which of
-- the jobs' handlers ran is not known: a peer's finding), a job whose handler was never
-- seen running (_forgivable) is forgiven as a lost lease is: no crash, one attempt more,
-- ready at once in its old place. Fenced by the dead owner. Wakes idle workers, so they
-- sleep until the retry is due rather than their poll interval.
WITH due AS (
    SELECT d.id, f.forgiven, NOT f.forgiven AND q.quarantined AS quarantined,
           CASE WHEN f.forgiven THEN NULL ELSE d.delay END AS delay,
           NOT f.forgiven AND (q.quarantined OR j.attempts >= j.max_attempts) AS dead,
           CASE WHEN f.forgiven THEN %(error)s::text || ' ' || {_forgiven_note}
               WHEN q.quarantined
               THEN format('Quarantined: crashed its worker %%s times (max_crashes %%s); last: %%s',
                           j.crashes + 1, j.max_crashes, %(error)s::text)
               ELSE %(error)s::text END AS error
    FROM unnest(%(ids)s::bigint[], %(delays)s::float8[]) AS d(id, delay)
    JOIN {schema}.jobs AS j ON j.id = d.id,
    LATERAL (SELECT %(crash)s::boolean AND j.crashes + 1 >= j.max_crashes AS quarantined) AS q,
    LATERAL (SELECT %(forgive)s::boolean AND {_forgivable} AS forgiven) AS f
), charged AS (
    UPDATE {schema}.jobs AS j SET
        state = CASE WHEN due.dead THEN 'dead' ELSE 'ready' END::{schema}.job_state,
        available_at = CASE WHEN due.dead THEN j.available_at
            ELSE coalesce(now() + make_interval(secs => due.delay), j.available_at) END,
        completed_at = CASE WHEN due.dead THEN now() END,
        crashes = j.crashes + CASE WHEN %(crash)s::boolean AND NOT due.forgiven THEN 1 ELSE 0 END,
        max_attempts = j.max_attempts + CASE WHEN due.forgiven THEN 1 ELSE 0 END,
        leases_forgiven = j.leases_forgiven + CASE WHEN due.forgiven THEN 1 ELSE 0 END,
        lease_owner = NULL,
        lease_until = NULL,
        last_error = due.error,
        errors = j.errors || jsonb_build_object(
            'attempt', j.attempts, 'at', now(), 'worker', j.lease_owner, 'error', due.error)
    FROM due
    WHERE j.id = due.id AND j.state = 'running' AND j.lease_owner = %(owner)s::text
    RETURNING j.id, j.state::text AS state, j.attempts, j.queue, j.task, due.quarantined,
              due.forgiven
), woken AS (
    SELECT count(pg_notify('{channel}', q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM charged WHERE state = 'ready') AS q
)
SELECT charged.id, charged.state, charged.attempts, charged.queue, charged.task,
       charged.quarantined, charged.forgiven
FROM charged, woken;

-- name: job_release_owner
-- Give back every job a stopped worker process still holds, attempt not counted.
WITH released AS (
    UPDATE {schema}.jobs AS j SET
        state = 'ready', attempts = greatest(j.attempts - 1, 0), available_at = now(),
        lease_owner = NULL, lease_until = NULL
    WHERE j.state = 'running' AND j.lease_owner = %(owner)s::text
    RETURNING j.id, j.queue, j.task
), woken AS (
    SELECT count(pg_notify('{channel}', q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM released) AS q
)
SELECT released.id, released.queue, released.task FROM released, woken;

-- name: job_let_go_cancelled
-- A dead (or killed) worker process's cancelled jobs, whose handlers may have run on
-- after the cancel (store/limits.sql, migration 0013): no handler of theirs runs any
-- more, so their holds end and their limits' slots free; their queues' workers are woken.
-- Returns how many.
WITH gone AS (
    UPDATE {schema}.jobs AS j SET stopping_owner = NULL, stopping_until = NULL
    WHERE j.stopping_owner = %(owner)s::text
    RETURNING j.queue, j.limited
), woken AS (
    SELECT count(pg_notify('{channel}', q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM gone WHERE limited) AS q
)
SELECT count(*) FROM gone, woken;

-- name: backend_terminate
-- End every session of one worker process (by its application_name), its effect
-- transaction among them: once the supervisor killed it or saw it die, nothing of it
-- may keep holding row locks or the vacuum horizon. A role may end its own sessions.
SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid)) FROM pg_stat_activity AS a
WHERE a.application_name = %(name)s::text AND a.datname = current_database()
  AND a.pid <> pg_backend_pid() AND pg_has_role(a.usesysid, 'MEMBER');

-- name: job_backlog
-- Ready jobs due now in the given queues, paused ones left out (capped: autoscaling
-- needs "how many", not all), through the two claim indexes.
SELECT count(*) FROM (
    (SELECT 1 FROM {schema}.jobs
     WHERE state = 'ready' AND limit_key IS NULL AND queue = ANY(%(queues)s::text[])
       AND available_at <= now()
       AND queue NOT IN (SELECT p.queue FROM {schema}.paused_queues AS p)
     LIMIT %(cap)s)
    UNION ALL
    (SELECT 1 FROM {schema}.jobs
     WHERE state = 'ready' AND limit_key IS NOT NULL AND queue = ANY(%(queues)s::text[])
       AND available_at <= now()
       AND queue NOT IN (SELECT p.queue FROM {schema}.paused_queues AS p)
     LIMIT %(cap)s)
    LIMIT %(cap)s
) AS due;

-- name: process_upsert_many
-- Register or heartbeat a supervisor and its workers in one statement.
INSERT INTO {schema}.processes
    (id, kind, host, pid, supervisor_id, queues, current_job, rss_bytes, started_at,
     heartbeat_at, labels)
SELECT id, kind, host, pid, supervisor_id, string_to_array(queues, ','), current_job,
       rss_bytes, now() - make_interval(secs => uptime), now(),
       coalesce(string_to_array(nullif(labels, ''), ','), '{}')
FROM unnest(
    %(id)s::text[], %(kind)s::text[], %(host)s::text[], %(pid)s::integer[],
    %(supervisor_id)s::text[], %(queues)s::text[], %(current_job)s::bigint[],
    %(rss_bytes)s::bigint[], %(uptime)s::float8[], %(labels)s::text[]
) AS p(id, kind, host, pid, supervisor_id, queues, current_job, rss_bytes, uptime, labels)
ON CONFLICT (id) DO UPDATE SET
    current_job = excluded.current_job,
    rss_bytes = excluded.rss_bytes,
    heartbeat_at = now();

-- name: process_forget
-- Deregister this supervisor's workers that are gone (and, with no ids kept, itself).
DELETE FROM {schema}.processes
WHERE (supervisor_id = %(supervisor_id)s::text AND id <> ALL(%(keep)s::text[]))
   OR (id = %(supervisor_id)s::text AND cardinality(%(keep)s::text[]) = 0);

-- name: process_prune_stale
-- Forget processes that stopped heart-beating. The registry is for display and for
-- limit shares (store/limits.sql): who is dead, and what their jobs are charged, is
-- decided by liveness locks (supervisor/deaths.py).
DELETE FROM {schema}.processes
WHERE heartbeat_at < now() - make_interval(secs => %(stale)s::float8)
RETURNING id;

-- name: backend_count
-- How many sessions one worker process still has (after backend_terminate, until gone).
SELECT count(*) FROM pg_stat_activity AS a
WHERE a.application_name = %(name)s::text AND a.datname = current_database()
  AND a.pid <> pg_backend_pid();
