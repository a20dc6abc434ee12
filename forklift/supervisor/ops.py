"""The supervisor's helper threads: the HTTP server (/metrics, /healthz, /readyz), the one
database thread (every statement the parent runs; dbthread.py) and the session thread
(the liveness lock, LISTEN, the maintenance lock; session.py).

None of them shares a lock with the loop across I/O: the loop submits database work and
goes on; they read only the published snapshot (see snapshot.py), never the loop's live
state.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from forklift._events import emit
from forklift.errors import ConfigError
from forklift.supervisor.dbthread import DbThread
from forklift.supervisor.probes import Probes
from forklift.supervisor.registry import ProcessRegistry
from forklift.supervisor.session import SupervisorSession

log = logging.getLogger(__name__)

Route = Callable[[], tuple[int, str, bytes]]


def parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:9090")
    return host.strip("[]") or "0.0.0.0", int(port)


class OpsServer:
    """Starts and stops the helper threads."""

    def __init__(
        self,
        addr: str | None,
        probes: Probes,
        metrics: CollectorRegistry,
        registry: ProcessRegistry,
        db: DbThread | None = None,
        session: SupervisorSession | None = None,
    ) -> None:
        self.addr = parse_addr(addr) if addr else None
        self.fork_lock = threading.Lock()  # the HTTP server's, around each request
        self.registry = registry
        self.db = db
        self.session = session
        self.routes: dict[str, Route] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(metrics)),
            "/healthz": lambda: _text(probes.health()),
            "/readyz": lambda: _text(probes.readiness()),
        }
        self._server: _Server | None = None
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self.bound: tuple[str, int] | None = None

    def start(self) -> None:
        if self.addr is not None:
            self._server = self._bind(self.addr)
            self._spawn_thread("forklift-http", self._server.serve_forever, 0.5)
        if self.session is not None:
            self._spawn_thread("forklift-session", self.session.run)
        if self.db is not None:
            self._spawn_thread("forklift-db", self.db.run)

    def _bind(self, addr: tuple[str, int]) -> _Server:
        try:
            server = _Server(addr, _handler_for(self.routes), self.fork_lock)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {addr[0]}:{addr[1]}: {exc.strerror or exc} "
                "(choose another --metrics-addr, or 'off')"
            ) from None
        host, port = server.server_address[:2]
        self.bound = (str(host), int(port))
        emit(log, "supervisor.http", addr=f"{self.bound[0]}:{self.bound[1]}")
        return server

    def _spawn_thread(self, name: str, target: Callable[..., object], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def close_in_child(self) -> None:
        """After fork: the child must not keep the parent's listening socket open."""
        if self._server is not None:
            self._server.socket.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the threads (the database thread after what the loop submitted, its
        last attributions among them), then deregister; within about `timeout` s."""
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self.db is not None:
            self.db.stop()
        if self.session is not None:
            self.session.stop()
        for thread in self._threads:
            thread.join(timeout=timeout)
        self.registry.deregister()


class _Server(HTTPServer):
    def __init__(
        self,
        addr: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        fork_lock: threading.Lock,
    ) -> None:
        self.fork_lock = fork_lock
        super().__init__(addr, handler)

    def _handle_request_noblock(self) -> None:
        # Accept, answer and close the client socket inside fork_lock: a child never
        # inherits a half-served connection.
        with self.fork_lock:
            super()._handle_request_noblock()  # type: ignore[misc]


def _handler_for(routes: dict[str, Route]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        """GET and HEAD on the known paths; 404 on any other path, 405 for any other
        method on a known one: nothing here changes anything, so nothing else is taken."""

        timeout = 5.0  # a slow client cannot hold the HTTP thread (nor fork_lock) long

        def do_GET(self) -> None:
            self._answer(with_body=True)

        def do_HEAD(self) -> None:
            self._answer(with_body=False)

        def __getattr__(self, name: str) -> Any:
            # http.server looks up do_<METHOD> for each request (501 when missing): every
            # other method, standard or made up, gets the same refusal.
            if name.startswith("do_"):
                return self._refuse
            raise AttributeError(name)

        def _route(self) -> Route | None:
            return routes.get(self.path.split("?", 1)[0])

        def _answer(self, *, with_body: bool) -> None:
            route = self._route()
            if route is None:
                self._send(404, "text/plain", b"try /metrics, /healthz or /readyz\n", with_body)
            else:
                self._send(*route(), with_body)  # under fork_lock (see _Server)

        def _refuse(self) -> None:
            if self._route() is None:
                self._send(404, "text/plain", b"try /metrics, /healthz or /readyz\n", True)
            else:
                self._send(405, "text/plain", b"only GET and HEAD\n", True, allow="GET, HEAD")

        def _send(
            self, status: int, ctype: str, body: bytes, with_body: bool, allow: str = ""
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if allow:
                self.send_header("Allow", allow)
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes every few seconds would drown the log

    return Handler


def _text(result: tuple[int, str]) -> tuple[int, str, bytes]:
    return result[0], "text/plain; charset=utf-8", result[1].encode()
