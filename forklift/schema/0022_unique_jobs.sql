-- forklift 0022: unique jobs, at most one live job per key (forklift.Unique; forklift/unique.py).
-- {schema} is replaced by the quoted schema name when the migration is applied.
--
-- A unique job carries its key (its task, its declaration and the arguments it is
-- unique by, hashed by the producer, followed by `@` and the period's number that the
-- inserting statement computed from the database's clock when it has a period) and the
-- states its key holds in, as a bitmask over job_state (unique_holds). The partial unique
-- index admits one row per key among the rows in a state of their own set: the database
-- refuses the second, whoever inserts it (a single enqueue, a bulk one, another replica),
-- so nothing is checked and then inserted. A job that moves to a state outside its set
-- leaves the index by itself; every set holds `ready` and `running`, between which jobs
-- move by themselves, so no worker's write ever brings a job back into the index.
ALTER TABLE {schema}.jobs
    ADD COLUMN IF NOT EXISTS unique_key text,
    ADD COLUMN IF NOT EXISTS unique_states smallint;

-- Whether a job in `state` holds its unique key, its set being `states` (a bit per state:
-- blocked 1, ready 2, running 4, succeeded 8, dead 16, cancelled 32; unique.STATE_BITS).
-- IMMUTABLE, as an index predicate must be: it reads only its arguments.
CREATE FUNCTION {schema}.unique_holds(state {schema}.job_state, states smallint)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (states & CASE state
        WHEN 'blocked' THEN 1 WHEN 'ready' THEN 2 WHEN 'running' THEN 4
        WHEN 'succeeded' THEN 8 WHEN 'dead' THEN 16 WHEN 'cancelled' THEN 32
        ELSE 0 END::smallint) <> 0
$$;

-- One live job per unique key: the arbiter of the unique inserts (store/queries.sql).
CREATE UNIQUE INDEX IF NOT EXISTS jobs_unique_idx ON {schema}.jobs (unique_key)
    WHERE unique_key IS NOT NULL AND {schema}.unique_holds(state, unique_states);

-- Every unique job by key, newest last: the job an enqueue met, found again once its
-- insert did nothing, even if it finished meanwhile (job_unique_holders).
CREATE INDEX IF NOT EXISTS jobs_unique_key_idx ON {schema}.jobs (unique_key, id)
    WHERE unique_key IS NOT NULL;
