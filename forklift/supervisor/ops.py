"""The supervisor's helper threads: the HTTP server (/metrics, /healthz, /readyz; http.py,
answered from memory), the one
database thread (every statement the parent runs; dbthread.py) and the session thread
(the liveness lock, LISTEN, the maintenance lock; session.py).

None of them shares a lock with the loop across I/O: the loop submits database work and
goes on; they read only the published snapshot (see snapshot.py), never the loop's live
state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from prometheus_client.registry import CollectorRegistry

from forklift.errors import ConfigError
from forklift.supervisor.dbthread import DbThread
from forklift.supervisor.http import HttpServer, Route, routes_for
from forklift.supervisor.probes import Probes
from forklift.supervisor.registry import ProcessRegistry
from forklift.supervisor.session import SupervisorSession

log = logging.getLogger(__name__)


def parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:9367")
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
        self.registry = registry
        self.probes = probes
        self.db = db
        self.session = session
        # What the routes answer is read from the database off the request path (the
        # probes' refresh is one of the database thread's services).
        self.routes: dict[str, Route] = routes_for(probes, metrics)
        self._http: HttpServer | None = None
        self._threads: list[threading.Thread] = []
        self.bound: tuple[str, int] | None = None

    def bind(self) -> None:
        """Bind the HTTP listener (ConfigError if the address is taken), no thread yet: the
        supervisor forks its first children between this and start()."""
        if self.addr is not None and self._http is None:
            self._http = HttpServer(self.addr, self.routes)
            self.bound = self._http.bind()

    def start(self) -> None:
        """Start the threads (binding first, if bind() was not called)."""
        self.bind()
        if self._http is not None:
            self._http.serve()
        if self.session is not None:
            self._spawn_thread("forklift-session", self.session.run)
        if self.db is not None:
            self._spawn_thread("forklift-db", self.db.run)

    def _spawn_thread(self, name: str, target: Callable[..., object], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def close_in_child(self) -> None:
        """After fork: the child must keep none of the HTTP server's sockets."""
        if self._http is not None:
            self._http.close_in_child()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads: the database thread after what the loop submitted (its last
        attributions among them) and the deregistration. Within `timeout` s whatever the
        database does: what is left then dies with the process (leases and the liveness
        lock cover it)."""
        if self._http is not None:
            self._http.stop()
        if self.db is not None:
            self.db.submit("registry", self.registry.deregister)
            self.db.stop()
        else:
            self.registry.deregister()
        if self.session is not None:
            self.session.stop()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
