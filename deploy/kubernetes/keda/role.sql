-- The role KEDA's postgresql scaler connects as (triggerauthentication.yaml): it may read
-- the columns of the ready line that scaledobject.yaml's queries read, and nothing else:
-- no job arguments, results or errors, no write. Run it as the owner of forklift's
-- schema, after `forklift migrate`, with the role created first:
--   CREATE ROLE forklift_keda LOGIN PASSWORD '...';
-- tests/deploy/test_keda.py runs these statements and the queries as that role.
--
-- Schema "forklift" (FORKLIFT_SCHEMA): rename it here if yours differs.

GRANT USAGE ON SCHEMA forklift TO forklift_keda;
GRANT SELECT (queue, state, limit_key, available_at) ON forklift.jobs TO forklift_keda;
GRANT SELECT (queue) ON forklift.paused_queues TO forklift_keda;

-- A scaler's query must never hold a connection or a snapshot for long.
ALTER ROLE forklift_keda SET statement_timeout = '5s';
ALTER ROLE forklift_keda SET idle_in_transaction_session_timeout = '10s';
