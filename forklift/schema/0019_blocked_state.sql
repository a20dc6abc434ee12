-- forklift 0019: the `blocked` job state, for workflow jobs whose upstream jobs have not
-- all finished (migration 0020). Its own migration: a value added to an enum can be used
-- only once the transaction that added it has committed.
ALTER TYPE {schema}.job_state ADD VALUE IF NOT EXISTS 'blocked' BEFORE 'ready';
