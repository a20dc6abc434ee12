"""The supervisor's session thread on a real connection: its LISTEN under a stream of
notifications."""

from __future__ import annotations

import logging
import os
import threading
import time

import psycopg
import pytest

from forklift import _db, _locks, _sql
from forklift.supervisor.session import HintFanout, SessionConfig, SupervisorSession
from forklift.testing import wait_for
from forklift.workers.wakeup import NEWS


def test_a_stream_of_notifications_is_never_taken_for_the_session_ending(
    dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Between two waits for notifications the session looks at its idle socket for a
    FATAL message or EOF; a NOTIFY landing there is input too, and must be forwarded,
    not read as the end of the session (which dropped the liveness lock and every hint
    for a tick). A tick of 1 ms and a notification every few hundred microseconds make
    that landing near certain."""
    caplog.set_level(logging.WARNING, logger="forklift.supervisor.session")
    fanout = HintFanout()
    hint_read, hint_write = os.pipe()
    read, write = os.pipe()  # a child's claim-loop self-pipe
    os.set_blocking(read, False)
    fanout.add(hint_write, write)
    session = SupervisorSession(
        dsn, _db.Timeouts(), schema, ("default",), fanout, SessionConfig(tick=0.001)
    )
    session.supervisor_id = "here:1:sup"
    thread = threading.Thread(target=session.run, daemon=True)
    thread.start()
    hints = b""
    try:
        assert session.vouch.wait(10)
        channel = _sql.channel_name(schema)
        with psycopg.connect(dsn, autocommit=True) as producer:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                producer.execute("SELECT pg_notify(%s, 'default')", (channel,))
                try:
                    hints += os.read(read, 65536)  # (the fanout never blocks on it)
                except BlockingIOError:
                    pass
        assert session.vouch.vouched()
    finally:
        session.stop()
        thread.join(timeout=5)
        fanout.remove(hint_write)
        os.close(read)
        os.close(hint_read)
    lost = [r.getMessage() for r in caplog.records if "session_lost" in r.getMessage()]
    assert lost == []
    assert hints.count(NEWS) > 100  # forwarded, each as it came


def test_a_terminated_session_is_taken_for_ended_and_comes_back(
    dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its end (a FATAL message, then EOF) is no notification: the session says it was
    lost and takes its lock back on a new connection."""
    caplog.set_level(logging.INFO, logger="forklift.supervisor.session")
    session = SupervisorSession(dsn, _db.Timeouts(), schema, ("default",), HintFanout())
    session.supervisor_id = "here:1:sup"
    thread = threading.Thread(target=session.run, daemon=True)
    thread.start()

    def said(event: str) -> bool:
        return any(event in r.getMessage() for r in caplog.records)

    try:
        assert session.vouch.wait(10)
        with psycopg.connect(dsn, autocommit=True) as admin:
            ended = admin.execute(  # the session that holds its liveness lock
                "SELECT pg_terminate_backend(l.pid) FROM pg_locks AS l "
                "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
                "AND l.classid::bigint = (%(key)s::bigint >> 32) "
                "AND l.objid::bigint = (%(key)s::bigint & 4294967295)",
                {"key": _locks.lock_key(session.liveness_lock)},
            ).fetchall()
        assert ended == [(True,)]
        wait_for(lambda: said("supervisor.session_back"), timeout=10, what="the session back")
        assert said("supervisor.session_lost") and session.vouch.vouched()
    finally:
        session.stop()
        thread.join(timeout=5)
