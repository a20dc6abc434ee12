-- forklift 0023: fair shares. The jobs of a task declared `fair=` (a key from its
-- arguments: the tenant, the account) are claimed in turns across their keys, so a key
-- with 10,000 jobs ahead in line does not make a key with one wait behind them all.
-- {schema} is replaced by the quoted schema name when the migration is applied.
--
-- Self-clocked fair queueing, with the clock in the rows: each fair job due now is given
-- a turn as it is inserted (by the trigger below, whatever inserts it: an enqueue, a
-- bulk COPY, a schedule, a batch, a workflow), and claims take fair jobs in turn order
-- (store/fair.sql), through one index, as the plain claim takes jobs in due order. A
-- job's turn is its key's last waiting job's turn plus 1/weight, or, when its key has no
-- job waiting, the turn of the head of the line (the least turn waiting at its
-- priority): a key that arrives is served next, a key with a backlog once per turn of
-- the others, and a key weighted 3 three times a turn. Nothing is counted or kept per
-- key elsewhere, and a claim costs what a plain one does: the turns were dealt at insert.
--
-- Only jobs due now hold turns. A job due later (a delay, a `run_at`, a retry's backoff,
-- a snooze) has none: it is inserted without one, and one that is given back to wait
-- loses its own (the second trigger). Such a job, once due, is claimed as one that
-- arrives then, beside the head of the line (store/fair.sql, `late`). So no job waiting
-- for its time holds the head's turn back (a newcomer would be dealt turns below every
-- backlog), nor counts as its key's backlog (its key's next job would be dealt turns
-- behind it).
--
-- The two lookups per inserted fair job (its key's last turn, the head's) are index
-- probes (jobs_ready_fair_key_idx, jobs_ready_fair_idx: migration 0024); rows without a
-- key skip both triggers at their WHEN. A job given back due now (a release: a graceful
-- stop, a dead worker's job forgiven) keeps its turn, as it keeps its due time.

ALTER TABLE {schema}.jobs
    ADD COLUMN IF NOT EXISTS fair_key text,
    ADD COLUMN IF NOT EXISTS fair_weight real,
    ADD COLUMN IF NOT EXISTS fair_turn float8;

CREATE FUNCTION {schema}.fair_turn_dealt() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    last_turn float8;
    head_turn float8;
BEGIN
    -- The key's last waiting job, plus one turn of that job's weight.
    SELECT j.fair_turn + 1.0 / coalesce(nullif(j.fair_weight, 0), 1) INTO last_turn
    FROM {schema}.jobs AS j
    WHERE j.state = 'ready' AND j.fair_key IS NOT NULL AND j.fair_turn IS NOT NULL
      AND j.queue = NEW.queue AND j.fair_key = NEW.fair_key
    ORDER BY j.fair_turn DESC
    LIMIT 1;
    -- The head of the line at its priority: a key that had nothing waiting starts there.
    SELECT j.fair_turn INTO head_turn
    FROM {schema}.jobs AS j
    WHERE j.state = 'ready' AND j.limit_key IS NULL AND j.fair_key IS NOT NULL
      AND j.fair_turn IS NOT NULL AND j.queue = NEW.queue AND j.priority = NEW.priority
    ORDER BY j.fair_turn
    LIMIT 1;
    NEW.fair_turn := greatest(coalesce(last_turn, head_turn, 0), coalesce(head_turn, 0));
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_fair_turn BEFORE INSERT ON {schema}.jobs
    FOR EACH ROW
    WHEN (NEW.fair_key IS NOT NULL AND NEW.fair_turn IS NULL AND NEW.state = 'ready'
          AND NEW.available_at <= now())
    EXECUTE FUNCTION {schema}.fair_turn_dealt();

CREATE FUNCTION {schema}.fair_turn_given_up() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.fair_turn := NULL;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_fair_turn_later BEFORE UPDATE ON {schema}.jobs
    FOR EACH ROW
    WHEN (NEW.fair_key IS NOT NULL AND NEW.fair_turn IS NOT NULL
          AND NEW.state = 'ready' AND NEW.available_at > now())
    EXECUTE FUNCTION {schema}.fair_turn_given_up();
