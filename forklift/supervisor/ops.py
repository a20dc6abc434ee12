"""The supervisor's helper threads: the HTTP server (/metrics, /healthz, /readyz; http.py,
answered from memory), the database thread (the statements that must be prompt:
charging deaths, the registry, schedules, the probes; dbthread.py), the maintenance
thread (what may take minutes: prunes, VACUUM; its own connection) and the session
thread (the liveness lock, LISTEN, the maintenance lock; session.py).

None of them shares a lock with the loop across I/O: the loop submits database work and
goes on; they read only the published snapshot (see snapshot.py), never the loop's live
state.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING

from forklift._conns import HeldConnection
from forklift._events import emit
from forklift.app import App
from forklift.errors import ConfigError
from forklift.metrics import Totals
from forklift.store import JobStore
from forklift.store.batches import BatchStore
from forklift.supervisor.config import SupervisorConfig
from forklift.supervisor.dbthread import DbService, DbThread
from forklift.supervisor.registry import ProcessRegistry
from forklift.supervisor.session import SupervisorSession
from forklift.workers.batch_ends import BatchSweep
from forklift.workers.maintenance import Maintenance, MaintenanceConfig

if TYPE_CHECKING:
    from forklift.supervisor.http import HttpServer, Route

log = logging.getLogger(__name__)

MAINTAINER = "forklift-maintenance"  # the application_name of maintenance's connection
BACKLOG = 1024  # connections queued before the server answers (waitress's own default)


def parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:9367")
    return host.strip("[]") or "0.0.0.0", int(port)


def bind_listener(addr: tuple[str, int]) -> socket.socket:
    """A TCP socket listening on `addr` (its first address, as waitress would take it);
    ConfigError if the address is taken or bad. A plain socket: the supervisor binds it
    before its first fork, and imports the HTTP server that answers on it after."""
    host, port = addr
    sock: socket.socket | None = None
    try:
        found = socket.getaddrinfo(
            host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, socket.IPPROTO_TCP,
            socket.AI_PASSIVE,
        )  # fmt: skip
        family, kind, proto, _, sockaddr = found[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr)
        sock.listen(BACKLOG)
    except OSError as exc:
        if sock is not None:
            sock.close()
        raise ConfigError(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc} "
            "(choose another --metrics-addr, or 'off')"
        ) from None
    return sock


class OpsServer:
    """Starts and stops the helper threads."""

    def __init__(
        self,
        addr: str | None,
        registry: ProcessRegistry,
        db: DbThread | None = None,
        session: SupervisorSession | None = None,
        *,
        maintenance: DbThread | None = None,
    ) -> None:
        self.addr = parse_addr(addr) if addr else None
        self.registry = registry
        self.db = db
        self.session = session
        self.maintenance = maintenance
        self._listener: socket.socket | None = None
        self._http: HttpServer | None = None
        self._threads: list[threading.Thread] = []
        self._session_thread: threading.Thread | None = None
        self.bound: tuple[str, int] | None = None

    def bind(self) -> None:
        """Bind the HTTP listener (ConfigError if the address is taken), no thread yet: the
        supervisor forks its first children between this and start()."""
        if self.addr is not None and self._listener is None:
            self._listener = bind_listener(self.addr)
            host, port = self._listener.getsockname()[:2]
            self.bound = (str(host), int(port))
            emit(log, "supervisor.http", addr=f"{host}:{port}")

    def start(self, routes: dict[str, Route]) -> None:
        """Start the threads (binding first, if bind() was not called); the HTTP server
        answers `routes` (http.routes_for: what they answer is read from the database off
        the request path, by the probes' refresh on the database thread)."""
        self.serve(routes)
        self.start_session()
        if self.db is not None:
            self._spawn_thread("forklift-db", self.db.run)
        if self.maintenance is not None:
            self._spawn_thread("forklift-maintenance", self.maintenance.run)

    def start_session(self) -> None:
        """Start the session thread (once): the children claim nothing until its liveness
        lock is held (shared_vouch.py), so it is taken as soon as they exist, not after
        the probes are built."""
        if self.session is not None and self._session_thread is None:
            self._session_thread = self._spawn_thread("forklift-session", self.session.run)

    def serve(self, routes: dict[str, Route]) -> None:
        """Answer `routes` on the bound port: the HTTP server starts now, or takes them in
        place of the ones it answered until now (binding first, if bind() was not
        called)."""
        self.bind()
        if self._listener is None:
            return
        if self._http is None:
            from forklift.supervisor.http import HttpServer  # waitress: the parent's only

            self._http = HttpServer(self._listener)
        self._http.serve(routes)

    def _spawn_thread(
        self, name: str, target: Callable[..., object], *args: object
    ) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def close_in_child(self) -> None:
        """In the fork server: keep no copy of the listener (the only socket there is
        when it is forked, before the HTTP server starts)."""
        if self._listener is not None:
            self._listener.close()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads: the database thread after what the loop submitted (its last
        attributions among them) and the deregistration. Within `timeout` s whatever the
        database does: what is left then dies with the process (leases and the liveness
        lock cover it). A maintenance statement under way is cancelled: a VACUUM may run
        for minutes."""
        if self.maintenance is not None:
            self.maintenance.stop()
            self.maintenance.cancel()
        if self._http is not None:
            self._http.stop()
        elif self._listener is not None:
            self._listener.close()
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


def maintenance_thread(
    app: App,
    cfg: SupervisorConfig,
    held: HeldConnection,
    session: SupervisorSession,
    totals: Totals,
    db: DbThread,
) -> DbThread | None:
    """Maintenance on a thread and a connection of its own, since nothing slow may share
    either with what must be prompt: a VACUUM or a prune of a big table takes minutes,
    while deaths must be charged, schedules fired and the probes refreshed within a
    second (on `db`). Its connection opens on the replica that holds the maintenance lock
    only."""
    w = cfg.worker
    if not w.maintenance:
        return None
    maintenance = Maintenance(
        JobStore(held, app.schema), app.dsn, held.timeouts,
        MaintenanceConfig(w.maintenance_interval, w.keep_finished, w.keep_dead),
        section=lambda: nullcontext(session.maintaining.is_set()),
        sweep=BatchSweep.of(BatchStore(held.connection, app.schema), totals, w),
        vacuum_on=held.connection,
    )  # fmt: skip
    services = [DbService("maintenance", 0.5, maintenance.run_due)]
    return DbThread(services, cancel=held.cancel, missing=db.missing)
