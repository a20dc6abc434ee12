-- The workflow store's queries (store/workflows.py); the graph's rules live in the
-- triggers of migration 0020. Each starts with `-- name: <name>` and a one-line
-- description; when loaded, `{schema}` becomes the quoted schema name.

-- name: workflow_create
-- A new workflow of `total` steps; its id.
INSERT INTO {schema}.workflows (name, context, total)
VALUES (%(name)s::text, %(context)s::jsonb, %(total)s::integer)
RETURNING id;

-- name: workflow_copy
-- Bulk-load a workflow's jobs with reserved ids: ready (no upstream job) or blocked.
COPY {schema}.jobs (id, {_job_columns}, workflow_id, step, waiting_on, state) FROM STDIN;

-- name: workflow_edges_copy
-- Bulk-load a workflow's edges.
COPY {schema}.workflow_edges (upstream, dependent, ignore_failure, workflow_id) FROM STDIN;

-- name: workflow_grow
-- A running step (`parent`, fenced by its lease: `owner`, `attempt`) adds a step to its
-- workflow after itself and the steps in `after`; the parent's dependents wait for it
-- too (it is grafted in before them). A step of that name already there (the parent's
-- earlier attempt added it) is left as it is. Returns the step's id; no row: the parent
-- is no longer this worker's.
WITH parent AS (
    SELECT p.id, p.workflow_id FROM {schema}.jobs AS p
    WHERE p.id = %(parent)s::bigint AND p.state = 'running'
      AND p.lease_owner = %(owner)s::text AND p.attempts = %(attempt)s::integer
), upstream AS (
    SELECT parent.id FROM parent
    UNION
    SELECT u.id FROM {schema}.jobs AS u, parent
    WHERE u.id = ANY(%(after)s::bigint[]) AND u.workflow_id = parent.workflow_id
), new AS (
    INSERT INTO {schema}.jobs ({_job_columns}, workflow_id, step, waiting_on, state)
    SELECT {_job_columns}, parent.workflow_id, %(step)s::text,
           (SELECT count(*) FROM upstream)::integer, 'blocked'
    FROM parent, jsonb_populate_record(NULL::{schema}.jobs, %(job)s::jsonb) AS j
    ON CONFLICT (workflow_id, step) WHERE workflow_id IS NOT NULL DO NOTHING
    RETURNING id, workflow_id
), edges AS (
    INSERT INTO {schema}.workflow_edges (upstream, dependent, ignore_failure, workflow_id, grown)
    SELECT upstream.id, new.id, false, new.workflow_id, upstream.id = %(parent)s::bigint
    FROM new, upstream
    UNION ALL
    SELECT new.id, e.dependent, e.ignore_failure, new.workflow_id, false
    FROM new, {schema}.workflow_edges AS e
    WHERE e.upstream = %(parent)s::bigint AND NOT e.grown
), grafted AS (
    UPDATE {schema}.jobs AS d SET waiting_on = d.waiting_on + 1
    FROM {schema}.workflow_edges AS e, new
    WHERE e.upstream = %(parent)s::bigint AND NOT e.grown AND d.id = e.dependent
), counted AS (
    UPDATE {schema}.workflows AS w SET total = w.total + 1 FROM new WHERE w.id = new.workflow_id
)
SELECT coalesce((SELECT id FROM new),
                (SELECT j.id FROM {schema}.jobs AS j, parent
                 WHERE j.workflow_id = parent.workflow_id AND j.step = %(step)s::text)) AS id
FROM parent;

-- name: workflow_upstream
-- A job's upstream jobs: what its handler reads as ctx.upstream.
SELECT j.id, j.step, j.task, j.state::text AS state, j.result::text AS result, j.last_error
FROM {schema}.workflow_edges AS e JOIN {schema}.jobs AS j ON j.id = e.upstream
WHERE e.dependent = %(id)s::bigint
ORDER BY j.id;

-- name: workflow_of_job
-- The workflow a job is a step of, as its handler reads it (ctx.workflow), and its step.
SELECT w.id, w.name, w.context::text AS context, j.step
FROM {schema}.jobs AS j JOIN {schema}.workflows AS w ON w.id = j.workflow_id
WHERE j.id = %(id)s::bigint;

-- name: workflow_get
-- A workflow as stored, with its jobs counted by state.
SELECT w.id, w.name, w.context::text AS context, w.total, w.created_at, w.cancelled_at,
       w.cancelled_by, w.finished_at, w.outcome, now() AS now,
       coalesce((SELECT jsonb_object_agg(s.state, s.n) FROM (
           SELECT j.state::text AS state, count(*) AS n FROM {schema}.jobs AS j
           WHERE j.workflow_id = w.id GROUP BY j.state) AS s), '{}'::jsonb) AS counts
FROM {schema}.workflows AS w
WHERE w.id = %(id)s::bigint;

-- name: workflow_list
-- Up to `limit` workflows, newest first (open ones only if `open`), with their jobs
-- counted by state.
SELECT w.id, w.name, w.context::text AS context, w.total, w.created_at, w.cancelled_at,
       w.cancelled_by, w.finished_at, w.outcome, now() AS now,
       coalesce((SELECT jsonb_object_agg(s.state, s.n) FROM (
           SELECT j.state::text AS state, count(*) AS n FROM {schema}.jobs AS j
           WHERE j.workflow_id = w.id GROUP BY j.state) AS s), '{}'::jsonb) AS counts
FROM {schema}.workflows AS w
WHERE NOT %(open)s::boolean OR w.finished_at IS NULL
ORDER BY w.id DESC
LIMIT %(limit)s;

-- name: workflow_steps
-- A workflow's jobs, in id order after `after`: each step's state and times, and the
-- ids of the jobs it waits for.
SELECT j.id, j.step, j.task, j.queue, j.state::text AS state, j.attempts, j.waiting_on,
       j.created_at, j.started_at, j.completed_at, j.last_error, j.upstream_failed,
       coalesce((SELECT array_agg(e.upstream ORDER BY e.upstream)
                 FROM {schema}.workflow_edges AS e WHERE e.dependent = j.id), '{}') AS after,
       coalesce((SELECT array_agg(e.upstream ORDER BY e.upstream)
                 FROM {schema}.workflow_edges AS e
                 WHERE e.dependent = j.id AND e.ignore_failure), '{}') AS ignoring
FROM {schema}.jobs AS j
WHERE j.workflow_id = %(id)s::bigint AND j.id > %(after)s::bigint
ORDER BY j.id
LIMIT %(limit)s;

-- name: workflow_open_jobs
-- A page of a workflow's open jobs (blocked, ready, running), in id order after `after`.
SELECT j.id FROM {schema}.jobs AS j
WHERE j.workflow_id = %(id)s::bigint AND j.state IN ('blocked', 'ready', 'running')
  AND j.id > %(after)s::bigint
ORDER BY j.id
LIMIT %(limit)s;

-- name: workflow_cancel
-- Mark a workflow cancelled (by whom), unless it finished or was cancelled already, or
-- none of its jobs is open (its last two ended at once, unseen: then finish it now).
WITH marked AS (
    UPDATE {schema}.workflows AS w SET cancelled_at = now(), cancelled_by = %(by)s::text
    WHERE w.id = %(id)s::bigint AND w.finished_at IS NULL AND w.cancelled_at IS NULL
      AND EXISTS (SELECT 1 FROM {schema}.jobs AS j
                  WHERE j.workflow_id = w.id AND j.state IN ('blocked', 'ready', 'running'))
    RETURNING w.id
)
SELECT EXISTS (SELECT 1 FROM marked) AS marked,
       NOT EXISTS (SELECT 1 FROM marked)
           AND coalesce({schema}.workflow_finish(%(id)s::bigint, '{done_channel}'), false)
           AS finished;

-- name: workflow_sweep
-- Finish up to `limit` open workflows after `after` none of whose jobs is open (their
-- last two jobs ended at once, each seeing the other open): the ids looked at, and
-- whether each was finished now.
SELECT w.id, coalesce({schema}.workflow_finish(w.id, '{done_channel}'), false) AS finished
FROM (SELECT id FROM {schema}.workflows
      WHERE finished_at IS NULL AND id > %(after)s::bigint
      ORDER BY id LIMIT %(limit)s) AS w;

-- name: workflow_prune
-- Delete finished workflows past the retention of finished jobs (a bounded batch at a
-- time), with their edges; their jobs go by the jobs' retention.
WITH gone AS (
    DELETE FROM {schema}.workflows
    WHERE id IN (SELECT w.id FROM {schema}.workflows AS w
                 WHERE w.finished_at < now() - make_interval(secs => %(keep)s::float8)
                 LIMIT %(limit)s)
    RETURNING id
)
DELETE FROM {schema}.workflow_edges AS e USING gone WHERE e.workflow_id = gone.id;

-- name: workflow_counts
-- Workflows by state, for the metrics: open ones (running) and those finished in the
-- last `window` seconds by outcome.
SELECT 'running' AS state, count(*) AS n FROM {schema}.workflows WHERE finished_at IS NULL
UNION ALL
SELECT w.outcome, count(*) FROM {schema}.workflows AS w
WHERE w.finished_at > now() - make_interval(secs => %(window)s::float8)
GROUP BY w.outcome;
