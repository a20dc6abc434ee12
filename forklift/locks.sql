-- Advisory locks (migrations, singleton sections). Each starts with `-- name: <name>`
-- and a one-line description. Keys come from forklift._locks.lock_key().

-- name: lock_wait
-- Take a session-level advisory lock, waiting for it (migrations serialize on it).
SELECT pg_advisory_lock(%(key)s::bigint);

-- name: lock_try
-- Try a session-level advisory lock without waiting; true if this session now holds it.
SELECT pg_try_advisory_lock(%(key)s::bigint);

-- name: lock_release
-- Release a session-level advisory lock this session holds.
SELECT pg_advisory_unlock(%(key)s::bigint);
