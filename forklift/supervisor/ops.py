"""The supervisor's helper threads: the HTTP server (/metrics, /healthz, /readyz), the
process registry heartbeat, and the services passed in (the cron scheduler).

All do their work under `fork_lock`, which the loop takes around each fork: a child is
never forked while one of them is mid-request or holds a connection. They read only the
published snapshot (see snapshot.py), never the loop's live state.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from forklift._events import emit
from forklift._service import run_every
from forklift.errors import ConfigError, ForkliftError
from forklift.supervisor.probes import Probes
from forklift.supervisor.registry import ProcessRegistry

log = logging.getLogger(__name__)

Route = Callable[[], tuple[int, str, bytes]]


@dataclass(frozen=True)
class OpsService:
    """A service an ops thread of its own runs at once, then every `every` seconds."""

    name: str
    every: float
    run_once: Callable[[], object]


def parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:9090")
    return host.strip("[]") or "0.0.0.0", int(port)


class OpsServer:
    """Starts and stops the helper threads; owns the fork lock they share with the loop."""

    def __init__(
        self,
        addr: str | None,
        probes: Probes,
        metrics: CollectorRegistry,
        registry: ProcessRegistry,
        services: Sequence[OpsService] = (),
    ) -> None:
        self.addr = parse_addr(addr) if addr else None
        self.fork_lock = threading.Lock()
        self.registry = registry
        self.services = tuple(services)
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
        self._spawn_thread("forklift-registry", self._heartbeat_loop)
        for service in self.services:
            self._spawn_thread(f"forklift-{service.name}", self._service_loop, service)

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

    def _heartbeat_loop(self) -> None:
        # The first heartbeat at once (the registry shows this supervisor from its start),
        # then every `every` seconds; a database outage is logged and outlived.
        delays = itertools.chain([0.0], itertools.repeat(self.registry.config.every))
        run_every(delays.__next__, self._heartbeat, self._stopped, log, "registry.heartbeat_failed")

    def _heartbeat(self) -> None:
        with self.fork_lock:
            self.registry.run_once()

    def _service_loop(self, service: OpsService) -> None:
        delays = itertools.chain([0.0], itertools.repeat(service.every))
        run_every(
            delays.__next__,
            lambda: self._run_service(service),
            self._stopped,
            log,
            f"{service.name}.failed",
        )

    def _run_service(self, service: OpsService) -> None:
        # Under fork_lock: a service holds a connection while it runs. A bug in it is
        # logged and outlived, as a database outage is (run_every), never a dead thread.
        with self.fork_lock:
            try:
                service.run_once()
            except ForkliftError:
                raise
            except Exception:
                log.exception("%s: round failed; next round as usual", service.name)

    def close_in_child(self) -> None:
        """After fork: the child must not keep the parent's listening socket open."""
        if self._server is not None:
            self._server.socket.close()

    def stop(self) -> None:
        """Stop both threads, then deregister (after any heartbeat still in flight)."""
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=10)
        with self.fork_lock:
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
