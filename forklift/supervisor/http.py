"""The ops HTTP server: /metrics, /healthz and /readyz served by waitress, off every lock.

waitress reads each request asynchronously on one event-loop thread and hands it to a
worker thread only once it is complete, so a client that drips bytes or sends nothing
holds a socket, never a thread; idle connections close after IDLE_TIMEOUT and every one
after CONNECTION_DEADLINE. The routes only read what is already in memory (the loop's
snapshot, the children's summed counters, the database's answers cached by the probes),
so an answer never waits on the database, on the loop, or on a lock the loop takes.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.server import TcpWSGIServer
from waitress.task import ThreadedTaskDispatcher

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment
    from prometheus_client.registry import CollectorRegistry

    from forklift.supervisor.probes import Probes

log = logging.getLogger(__name__)

Route = Callable[[], tuple[int, str, bytes]]

THREADS = 2  # every answer is read from memory: two threads are plenty
CONNECTION_LIMIT = 500  # open connections at once; past it new ones wait in the backlog
IDLE_TIMEOUT = 10.0  # a connection that sends nothing this long is closed
CONNECTION_DEADLINE = 30.0  # and any connection not being answered, this long after it opened
MAX_HEADER_BYTES = 8192
NOT_FOUND = b"try /metrics, /healthz or /readyz\n"
TEXT = "text/plain; charset=utf-8"


def routes_for(probes: Probes, metrics: CollectorRegistry) -> dict[str, Route]:
    """The paths and their answers; `metrics` collects from memory only (see probes.py)."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest  # as probes.py does

    return {
        "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(metrics)),
        "/healthz": lambda: _text(probes.health()),
        "/readyz": lambda: _text(probes.readiness()),
    }


def boot_routes() -> dict[str, Route]:
    """What the server answers from the first fork until the probes are built (their
    imports take a while): alive, not ready yet, no metrics yet."""
    starting = (503, TEXT, b"not ready: starting\n")
    return {
        "/metrics": lambda: starting,
        "/healthz": lambda: (200, TEXT, b"ok\n"),
        "/readyz": lambda: starting,
    }


class OpsApp:
    """The WSGI application: GET and HEAD on the known paths; 404 on any other path, 405
    for any other method on a known one (nothing here changes anything)."""

    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        route = self.routes.get(environ.get("PATH_INFO", ""))
        headers = []
        if route is None:
            status, ctype, body = 404, TEXT, NOT_FOUND
        elif method not in ("GET", "HEAD"):
            status, ctype, body = 405, TEXT, b"only GET and HEAD\n"
            headers.append(("Allow", "GET, HEAD"))
        else:
            status, ctype, body = route()
        headers += [("Content-Type", ctype), ("Content-Length", str(len(body)))]
        start_response(f"{status} {HTTPStatus(status).phrase}", headers)
        return [b""] if method == "HEAD" and route is not None else [body]


class DeadlineServer(TcpWSGIServer):
    """waitress's TCP server, closing every connection that has lived past
    CONNECTION_DEADLINE with no request being answered on it (the dashboard's is one too)."""

    def maintenance(self, now: float) -> None:
        # waitress closes connections idle past channel_timeout; a client that drips a
        # byte now and then is never idle, so also close any connection that has lived
        # past the deadline with no request being answered on it.
        super().maintenance(now)  # type: ignore[arg-type]
        cutoff = now - CONNECTION_DEADLINE
        channels: dict[int, Any] = self.active_channels  # type: ignore[assignment]
        for channel in channels.values():
            if not channel.requests and channel.creation_time < cutoff:
                channel.will_close = True


class HttpServer:
    """Serves a bound socket on a thread of its own, stops; and closes its sockets in a
    child."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener  # bound and listening (ops.bind_listener)
        self.app = OpsApp({})  # its routes come with serve()
        self._server: DeadlineServer | None = None
        self._map: dict[int, Any] = {}  # waitress's sockets: the listener, clients, trigger
        self._thread: threading.Thread | None = None
        host, port = listener.getsockname()[:2]
        self.bound: tuple[str, int] = (str(host), int(port))

    def prepare(self) -> None:
        """Take over the listener, starting no thread yet."""
        if self._server is not None:
            return
        sock = self.listener
        adj = Adjustments(
            sockets=[sock],
            ident="",  # no Server header: nothing tells a client what runs here
            threads=THREADS,
            connection_limit=CONNECTION_LIMIT,
            channel_timeout=IDLE_TIMEOUT,
            cleanup_interval=1,
            max_request_header_size=MAX_HEADER_BYTES,
            max_request_body_size=MAX_HEADER_BYTES,
            log_socket_errors=False,  # a client hanging up early is not an error
            asyncore_use_poll=True,  # select() fails past 1,024 descriptors
        )
        # "Client disconnected" (INFO) and "task queue depth" are a client's business.
        logging.getLogger("waitress").setLevel(logging.WARNING)
        logging.getLogger("waitress.queue").setLevel(logging.ERROR)
        dispatcher = ThreadedTaskDispatcher()  # its threads start in serve()
        sockinfo = (sock.family, sock.type, sock.proto, sock.getsockname())
        self._server = DeadlineServer(
            self.app, map=self._map, _sock=sock, dispatcher=dispatcher, adj=adj,
            bind_socket=False, sockinfo=sockinfo,
        )  # fmt: skip

    def serve(self, routes: dict[str, Route]) -> None:
        """Start answering `routes` (waitress's worker threads and its event loop's), or
        answer them from now on instead of the previous ones."""
        self.prepare()
        server = self._server
        self.app.routes = routes  # one reference swapped: a request sees old or new
        if server is None or self._thread is not None:
            return
        server.task_dispatcher.set_thread_count(THREADS)
        self._thread = threading.Thread(target=server.run, name="forklift-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            self.listener.close()
            return
        if self._thread is None:  # bound, never served: no loop to close them
            wasyncore.close_all(self._map, ignore_all=True)
            return
        # The event loop closes its own sockets (from its thread, as waitress expects),
        # then ends with nothing left to watch.
        trigger: Any = server.trigger  # (the stubs call it an int)
        trigger.pull_trigger(lambda: wasyncore.close_all(self._map, ignore_all=True))
        self._thread.join(timeout=5)
        server.task_dispatcher.shutdown(timeout=2)


def _text(result: tuple[int, str]) -> tuple[int, str, bytes]:
    return result[0], TEXT, result[1].encode()
