"""`forklift dashboard` running: a small pool of database connections, the Flask app, and
waitress serving it until SIGTERM or Ctrl-C.

waitress, as for the supervisor's /metrics: it reads each request asynchronously and
hands it to one of a few threads only once it is complete, so slow or idle clients hold
a socket, never a thread, and none for longer than a deadline; the live parts are polled
(a request a second per open page), so no connection stays open for long.
"""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType
from typing import Any, cast

from flask import Flask
from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.server import BaseWSGIServer, MultiSocketServer
from waitress.task import ThreadedTaskDispatcher

from forklift import _db
from forklift._events import emit
from forklift.admin import Connector
from forklift.dashboard.config import DashboardConfig
from forklift.dashboard.reader import Reader
from forklift.dashboard.web import create_app
from forklift.errors import ConfigError, DatabaseError
from forklift.supervisor.http import DeadlineServer

log = logging.getLogger(__name__)

THREADS = 4  # requests served at once; each holds a pooled connection while it reads
CONNECTION_LIMIT = 500  # open connections at once; past it new ones wait in the backlog
IDLE_TIMEOUT = 30.0  # a connection that sends nothing this long is closed
TIMEOUTS = _db.Timeouts(connect=2.0, statement=5.0, lock=2.0)


def _stop(signum: int, frame: FrameType | None) -> None:
    # waitress's loop ends on SystemExit raised in its thread (the main one), closing
    # its sockets and letting requests in flight finish.
    raise SystemExit(0)


def serve(config: DashboardConfig, dsn: str, schema: str) -> int:
    """Serve until SIGTERM or SIGINT; 0. ConfigError if the address cannot be bound."""
    for warning in config.checked():
        emit(log, "dashboard.warning", logging.WARNING, warning=warning)
        print(f"forklift dashboard: warning: {warning}", file=sys.stderr, flush=True)
    pool = _db.make_pool(
        dsn, TIMEOUTS, max_size=THREADS, min_size=1, name="forklift-dashboard",
        application_name="forklift-dashboard",
    )  # fmt: skip
    reader = Reader(dsn, schema, Connector(dsn, TIMEOUTS, pool))
    pool.open()
    try:
        reader.admin.ping()
    except DatabaseError as exc:
        # Pages say so until it answers: the dashboard of a database that is down
        # should say that, not be down itself.
        emit(log, "dashboard.database_error", logging.WARNING, error=str(exc))
    server = _bind(config, create_app(config, reader))
    if isinstance(server, MultiSocketServer):  # a name with several addresses
        listening = list(server.effective_listen)
    else:
        listening = [_address(server)]
    mode = "actions allowed" if config.allow_actions else "read-only"
    for host, port in listening:
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
        emit(log, "dashboard.started", url=url, mode=mode)
        print(f"forklift dashboard: {url} ({mode})", flush=True)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        server.run()
    finally:
        pool.close()
        emit(log, "dashboard.stopped")
    return 0


def _bind(config: DashboardConfig, app: Flask) -> MultiSocketServer | BaseWSGIServer:
    """waitress's servers on every address `config` names, each closing connections idle
    past IDLE_TIMEOUT and any not being answered past its deadline (the supervisor's
    DeadlineServer): a client that drips a byte now and then holds a socket for that long
    at most, never one of CONNECTION_LIMIT for good."""
    adj = Adjustments(
        host=config.host,
        port=config.port,
        threads=THREADS,
        ident="",  # no Server header
        channel_timeout=IDLE_TIMEOUT,
        connection_limit=CONNECTION_LIMIT,
        cleanup_interval=1,
        max_request_header_size=16 * 1024,
        max_request_body_size=64 * 1024,
        clear_untrusted_proxy_headers=True,
        asyncore_use_poll=True,  # select() fails past 1,024 descriptors
    )
    dispatcher = ThreadedTaskDispatcher()
    dispatcher.set_thread_count(THREADS)
    sockets: dict[int, Any] = {}
    try:
        servers = [
            DeadlineServer(app, sockets, dispatcher=dispatcher, adj=adj, sockinfo=info)
            for info in cast(list[Any], adj.listen)  # (the stubs call it a str)
        ]
    except OSError as exc:
        wasyncore.close_all(sockets, ignore_all=True)
        raise ConfigError(f"--bind {config.host}:{config.port}: {exc.strerror or exc}") from exc
    if len(servers) == 1:
        return servers[0]
    listening = [_address(s) for s in servers]
    return MultiSocketServer(sockets, adj, listening, dispatcher)


def _address(server: BaseWSGIServer) -> tuple[str, int]:
    assert server.socket is not None  # bound
    host, port = server.socket.getsockname()[:2]
    return str(host), int(port)
