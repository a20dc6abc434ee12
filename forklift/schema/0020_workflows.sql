-- forklift 0020: workflows, graphs of jobs that run once their upstream jobs succeeded
-- (app.workflow, forklift/workflow.py; docs/workflows.md).
-- {schema} is replaced by the quoted schema name when the migration is applied.
--
-- A workflow is a row here, its jobs (jobs.workflow_id, each with a step name unique in
-- it), and the edges between them. A job with upstream jobs not yet succeeded is
-- `blocked`: outside every claim's index, so a claim neither sees nor scans it. Its
-- `waiting_on` counts the edges into it not yet resolved (an upstream job succeeded, or,
-- over an edge with ignore_failure, ended whatever way). The triggers below keep the
-- count in every transaction that moves a workflow job's state, whichever statement does
-- it (a completion, a failure, a death, a cancel, a retry): a row trigger notes the
-- workflow jobs a statement ended or retried, and a statement trigger settles them at
-- the statement's end, set-based, locking the dependents in id order (so concurrent
-- settlings queue instead of deadlocking). The dependent's row lock orders concurrent
-- decrements, and only the one that takes it to 0 makes it ready, so two upstream jobs
-- ending at once release their dependent once.
CREATE TABLE {schema}.workflows (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text NOT NULL DEFAULT '',
    context      jsonb NOT NULL DEFAULT '{}'::jsonb,  -- readable by every step
    total        integer NOT NULL DEFAULT 0,          -- steps inserted, those grown included
    created_at   timestamptz NOT NULL DEFAULT now(),
    cancelled_at timestamptz,
    cancelled_by text,
    finished_at  timestamptz,                         -- none of its jobs open any more
    outcome      text,
    CONSTRAINT workflows_outcome
        CHECK (outcome IS NULL OR outcome IN ('succeeded', 'failed', 'cancelled'))
);

-- Workflows not finished: the sweep's, `workflows list`'s.
CREATE INDEX workflows_open_idx ON {schema}.workflows (id) WHERE finished_at IS NULL;
-- Finished workflows by time: retention.
CREATE INDEX workflows_finished_idx ON {schema}.workflows (finished_at)
    WHERE finished_at IS NOT NULL;

ALTER TABLE {schema}.jobs
    ADD COLUMN workflow_id bigint,          -- no foreign key, as batch_id
    ADD COLUMN step text,                   -- its name in its workflow
    ADD COLUMN waiting_on integer NOT NULL DEFAULT 0,
    -- The upstream job whose death or cancel cancelled this one: a retry of that job
    -- brings this one back (blocked), and the jobs it cancelled in turn.
    ADD COLUMN upstream_failed bigint;

-- A workflow's jobs by step name (each name once), the way to all of them.
CREATE UNIQUE INDEX jobs_workflow_step_idx ON {schema}.jobs (workflow_id, step)
    WHERE workflow_id IS NOT NULL;
-- A workflow's open jobs: whether any is left, read backwards from its newest (a
-- graph's last steps wait longest). Plain jobs are never in it.
CREATE INDEX jobs_workflow_open_idx ON {schema}.jobs (workflow_id, id)
    WHERE workflow_id IS NOT NULL AND state IN ('blocked', 'ready', 'running');

-- Blocked jobs per queue: `forklift status` and the queue gauges count them (up to a cap)
-- without reading a workflow. A job enters it once (enqueued or grown blocked) and leaves
-- it once (released or cancelled).
CREATE INDEX jobs_blocked_idx ON {schema}.jobs (queue, id) WHERE state = 'blocked';

CREATE TABLE {schema}.workflow_edges (
    upstream       bigint NOT NULL,
    dependent      bigint NOT NULL,
    ignore_failure boolean NOT NULL DEFAULT false,
    workflow_id    bigint NOT NULL,
    -- From a running step to a step it added (ctx.workflow.add): the steps it added next
    -- are grafted in before its other dependents, not before these.
    grown          boolean NOT NULL DEFAULT false,
    PRIMARY KEY (upstream, dependent)
);
CREATE INDEX workflow_edges_dependent_idx ON {schema}.workflow_edges (dependent);
CREATE INDEX workflow_edges_workflow_idx ON {schema}.workflow_edges (workflow_id);

-- Whether retention and purges keep the jobs of workflow `id`: until it has finished
-- (a dependent reads its upstream jobs' results).
CREATE FUNCTION {schema}.workflow_holds(id bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM {schema}.workflows AS w
                   WHERE w.id = workflow_holds.id AND w.finished_at IS NULL)
$$;

-- A workflow job set ready while it still waits (a retry of a step cancelled with its
-- upstream) stays blocked; cancelled again if an upstream job it needs is still dead or
-- cancelled.
CREATE FUNCTION {schema}.workflow_hold() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    failed bigint;
BEGIN
    SELECT e.upstream INTO failed
    FROM {schema}.workflow_edges AS e JOIN {schema}.jobs AS u ON u.id = e.upstream
    WHERE e.dependent = NEW.id AND NOT e.ignore_failure AND u.state IN ('dead', 'cancelled')
    LIMIT 1;
    IF failed IS NULL THEN
        NEW.state := 'blocked';
    ELSE
        NEW.state := 'cancelled';
        NEW.completed_at := now();
        NEW.upstream_failed := failed;
        NEW.last_error := format('Cancelled: its upstream job %s did not succeed', failed);
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_workflow_hold BEFORE UPDATE OF state ON {schema}.jobs
    FOR EACH ROW
    WHEN (NEW.workflow_id IS NOT NULL AND NEW.state = 'ready' AND NEW.waiting_on > 0)
    EXECUTE FUNCTION {schema}.workflow_hold();

-- A workflow job ended (succeeded, dead, cancelled) or was retried from dead or
-- cancelled: noted, in this transaction, for the statement's settling below (its
-- `WHEN` costs a plain job's update one test, and a workflow job's claim none). The
-- note is a transaction-local setting, `e<id>,` for an end, `r<id>,` for a retry.
CREATE FUNCTION {schema}.workflow_moved() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config(
        'forklift.moved',
        coalesce(current_setting('forklift.moved', true), '')
            || CASE WHEN NEW.state IN ('succeeded', 'dead', 'cancelled') THEN 'e' ELSE 'r' END
            || NEW.id || ',',
        true);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_workflow_moved AFTER UPDATE OF state ON {schema}.jobs
    FOR EACH ROW
    WHEN (NEW.workflow_id IS NOT NULL AND OLD.state IS DISTINCT FROM NEW.state
          AND ((NEW.state IN ('succeeded', 'dead', 'cancelled')
                AND OLD.state NOT IN ('succeeded', 'dead', 'cancelled'))
               OR (OLD.state IN ('dead', 'cancelled')
                   AND NEW.state NOT IN ('succeeded', 'dead', 'cancelled'))))
    EXECUTE FUNCTION {schema}.workflow_moved();

-- At the end of each statement that moved jobs' states: settle the workflow jobs it
-- noted (nothing to do, one setting read, for every other). Set-based, and every
-- dependent it changes is locked first, in id order, so two transactions settling
-- at once queue on a row instead of deadlocking. pg_trigger_depth() > 1: a statement
-- of this function's own (a cascade or a restore, whose walk the outer call did);
-- only the edges that ignore failure are left to it.
CREATE FUNCTION {schema}.workflow_settle() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    moved text := current_setting('forklift.moved', true);
    ended bigint[];
    retried bigint[];
    outer_call boolean := pg_trigger_depth() = 1;
    frontier bigint[];
    wf bigint;
    n bigint;
BEGIN
    IF moved IS NULL OR moved = '' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('forklift.moved', '', true);
    SELECT array_agg(substr(m, 2)::bigint) FILTER (WHERE left(m, 1) = 'e'),
           array_agg(substr(m, 2)::bigint) FILTER (WHERE left(m, 1) = 'r')
    INTO ended, retried
    FROM unnest(string_to_array(rtrim(moved, ','), ',')) AS m;

    IF ended IS NOT NULL THEN
        -- Resolved edges: a success resolves all of a job's, a failure those that ignore
        -- it. Each dependent is decremented once by all its resolved edges; the
        -- decrement that reaches 0 releases it (a blocked job only).
        WITH resolved AS (
            SELECT e.dependent, count(*) AS n
            FROM {schema}.jobs AS u JOIN {schema}.workflow_edges AS e ON e.upstream = u.id
            WHERE u.id = ANY(ended) AND (u.state = 'succeeded' OR e.ignore_failure)
            GROUP BY e.dependent
        ), locked AS (
            SELECT j.id, r.n FROM {schema}.jobs AS j JOIN resolved AS r ON r.dependent = j.id
            ORDER BY j.id
            FOR NO KEY UPDATE OF j
        ), released AS (
            UPDATE {schema}.jobs AS j SET
                waiting_on = j.waiting_on - l.n,
                state = CASE WHEN j.state = 'blocked' AND j.waiting_on <= l.n
                             THEN 'ready'::{schema}.job_state ELSE j.state END,
                available_at = CASE WHEN j.state = 'blocked' AND j.waiting_on <= l.n
                                    THEN greatest(j.available_at, now()) ELSE j.available_at END
            FROM locked AS l
            WHERE j.id = l.id
            RETURNING j.queue, j.state
        )
        SELECT count(pg_notify(TG_TABLE_SCHEMA || '_jobs', q.queue)) INTO n
        FROM (SELECT DISTINCT queue FROM released WHERE state = 'ready') AS q;
    END IF;

    IF ended IS NOT NULL AND outer_call THEN
        -- Everything that needs a failed job, directly or through others, and has not
        -- started: cancelled, each naming the upstream job it waited on.
        WITH RECURSIVE doomed AS (
            SELECT e.dependent AS id, e.upstream AS cause
            FROM {schema}.jobs AS u
            JOIN {schema}.workflow_edges AS e ON e.upstream = u.id AND NOT e.ignore_failure
            JOIN {schema}.jobs AS j ON j.id = e.dependent AND j.state = 'blocked'
            WHERE u.id = ANY(ended) AND u.state IN ('dead', 'cancelled')
          UNION
            SELECT e.dependent, e.upstream
            FROM doomed AS d
            JOIN {schema}.workflow_edges AS e ON e.upstream = d.id AND NOT e.ignore_failure
            JOIN {schema}.jobs AS j ON j.id = e.dependent AND j.state = 'blocked'
        ), one AS (
            SELECT DISTINCT ON (d.id) d.id, d.cause, u.step, u.task, u.state
            FROM doomed AS d JOIN {schema}.jobs AS u ON u.id = d.cause
            ORDER BY d.id, d.cause
        ), locked AS (
            SELECT j.id FROM {schema}.jobs AS j WHERE j.id IN (SELECT id FROM one)
            ORDER BY j.id
            FOR NO KEY UPDATE OF j
        ), cancelled AS (
            UPDATE {schema}.jobs AS j SET
                state = 'cancelled', completed_at = now(), upstream_failed = one.cause,
                last_error = format('Cancelled: upstream job %s (%s) %s', one.cause,
                                    coalesce(one.step, one.task), one.state),
                errors = j.errors || jsonb_build_object(
                    'attempt', j.attempts, 'at', now(), 'worker', NULL,
                    'error', format('Cancelled: upstream job %s (%s) %s', one.cause,
                                    coalesce(one.step, one.task), one.state))
            FROM one
            WHERE j.id = one.id AND j.state = 'blocked' AND j.id IN (SELECT id FROM locked)
            RETURNING j.id, j.waited
        )
        SELECT count(pg_notify(TG_TABLE_SCHEMA || '_done', 'j' || c.id)) INTO n
        FROM cancelled AS c WHERE c.waited;
    END IF;

    IF retried IS NOT NULL THEN
        -- A retried job: the edges that ignored its failure wait for it again (a
        -- dependent that has not started goes back to blocked).
        WITH again AS (
            SELECT e.dependent, count(*) AS n FROM {schema}.workflow_edges AS e
            WHERE e.upstream = ANY(retried) AND e.ignore_failure
            GROUP BY e.dependent
        ), locked AS (
            SELECT j.id, a.n FROM {schema}.jobs AS j JOIN again AS a ON a.dependent = j.id
            ORDER BY j.id
            FOR NO KEY UPDATE OF j
        )
        UPDATE {schema}.jobs AS j SET
            waiting_on = j.waiting_on + l.n,
            state = CASE WHEN j.state = 'ready' THEN 'blocked'::{schema}.job_state
                         ELSE j.state END
        FROM locked AS l
        WHERE j.id = l.id;
    END IF;

    IF retried IS NOT NULL AND outer_call THEN
        -- ... and the jobs its failure cancelled come back, level by level, each once
        -- none of the upstream jobs it needs is still dead or cancelled.
        frontier := retried;
        WHILE cardinality(frontier) > 0 LOOP
            WITH candidates AS (
                SELECT j.id, e.upstream FROM {schema}.workflow_edges AS e
                JOIN {schema}.jobs AS j ON j.id = e.dependent
                WHERE e.upstream = ANY(frontier) AND NOT e.ignore_failure
                  AND j.state = 'cancelled' AND j.upstream_failed = e.upstream
                  AND NOT EXISTS (
                      SELECT 1 FROM {schema}.workflow_edges AS f
                      JOIN {schema}.jobs AS u ON u.id = f.upstream
                      WHERE f.dependent = j.id AND NOT f.ignore_failure
                        AND u.state IN ('dead', 'cancelled'))
            ), locked AS (
                SELECT j.id FROM {schema}.jobs AS j
                WHERE j.id IN (SELECT id FROM candidates)
                ORDER BY j.id
                FOR NO KEY UPDATE OF j
            ), restored AS (
                UPDATE {schema}.jobs AS j SET
                    state = 'blocked', completed_at = NULL, upstream_failed = NULL,
                    last_error = NULL,
                    errors = j.errors || jsonb_build_object(
                        'attempt', j.attempts, 'at', now(), 'worker', NULL,
                        'error', format('Blocked again: upstream job %s was retried',
                                        c.upstream))
                FROM candidates AS c
                WHERE j.id = c.id AND j.id IN (SELECT id FROM locked)
                RETURNING j.id
            )
            SELECT coalesce(array_agg(DISTINCT id), '{}') INTO frontier FROM restored;
        END LOOP;
        UPDATE {schema}.workflows SET finished_at = NULL, outcome = NULL
        WHERE id IN (SELECT j.workflow_id FROM {schema}.jobs AS j WHERE j.id = ANY(retried))
          AND finished_at IS NOT NULL;
    END IF;

    IF ended IS NOT NULL AND outer_call THEN
        -- A workflow may have finished only where a job ended that released nothing:
        -- a failure, or a step no other waits for (a success with dependents left them
        -- open, or released them).
        FOR wf IN
            SELECT DISTINCT j.workflow_id FROM {schema}.jobs AS j
            WHERE j.id = ANY(ended)
              AND (j.state <> 'succeeded'
                   OR NOT EXISTS (SELECT 1 FROM {schema}.workflow_edges AS e
                                  WHERE e.upstream = j.id))
            ORDER BY 1
        LOOP
            PERFORM {schema}.workflow_finish(wf, TG_TABLE_SCHEMA || '_done');
        END LOOP;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_workflow_settle AFTER UPDATE OF state ON {schema}.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION {schema}.workflow_settle();

-- Mark workflow `id` finished if none of its jobs is open: 'cancelled' if it was
-- cancelled, 'failed' if a job of it is dead or was cancelled, else 'succeeded'. Two
-- last jobs ending at once in two transactions may each see the other open: the
-- workers' sweep (workflow_sweep) finishes those. True if it finished it now (its
-- waiters, wf.wait(), are told: `w<id>` on `done_channel`).
CREATE FUNCTION {schema}.workflow_finish(id bigint, done_channel text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    found bigint;
BEGIN
    -- Read backwards from its newest job: a graph's last steps stay open longest, and
    -- its first ones' ended entries are never walked while any is open.
    IF (SELECT j.id FROM {schema}.jobs AS j
        WHERE j.workflow_id = workflow_finish.id AND j.state IN ('blocked', 'ready', 'running')
        ORDER BY j.id DESC LIMIT 1) IS NOT NULL THEN
        RETURN false;
    END IF;
    UPDATE {schema}.workflows AS w SET
        finished_at = now(),
        outcome = CASE
            WHEN w.cancelled_at IS NOT NULL THEN 'cancelled'
            WHEN EXISTS (SELECT 1 FROM {schema}.jobs AS j
                         WHERE j.workflow_id = w.id AND j.state IN ('dead', 'cancelled'))
                THEN 'failed'
            ELSE 'succeeded' END
    WHERE w.id = workflow_finish.id AND w.finished_at IS NULL
    RETURNING w.id INTO found;
    IF found IS NULL THEN
        RETURN false;
    END IF;
    PERFORM pg_notify(done_channel, 'w' || found);
    RETURN true;
END
$$;
