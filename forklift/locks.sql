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

-- name: lock_held
-- Whether this session holds the advisory lock (a bigint key is classid = its high 32
-- bits, objid = its low 32, objsubid = 1 in pg_locks).
SELECT EXISTS (
    SELECT 1 FROM pg_locks AS l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.pid = pg_backend_pid()
      AND l.classid::bigint = (%(key)s::bigint >> 32)
      AND l.objid::bigint = (%(key)s::bigint & 4294967295)
);

-- name: lock_held_many
-- Which of the given advisory-lock keys some session of this database holds now.
SELECT k.key FROM unnest(%(keys)s::bigint[]) AS k(key)
WHERE EXISTS (
    SELECT 1 FROM pg_locks AS l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid::bigint = (k.key >> 32)
      AND l.objid::bigint = (k.key & 4294967295)
);
