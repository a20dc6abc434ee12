"""The supervisor's helper threads: the HTTP server (/metrics, /healthz, /readyz; see
http.py), the process registry heartbeat, and the services passed in (the cron scheduler).

The database work is done under `fork_lock`, which the loop takes around each fork: a
child is never forked while one of them holds a connection. HTTP takes no lock at all: it
answers from memory (the probes' cache, refreshed here like any other service). They read
only the published snapshot (see snapshot.py), never the loop's live state.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client.registry import CollectorRegistry

from forklift._service import run_every
from forklift.errors import ConfigError, ForkliftError
from forklift.supervisor.http import HttpServer, Route, routes_for
from forklift.supervisor.probes import REFRESH_EVERY, Probes
from forklift.supervisor.registry import ProcessRegistry

log = logging.getLogger(__name__)


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
        self.probes = probes
        self.routes: dict[str, Route] = routes_for(probes, metrics)
        # What the routes answer is read from the database here, off the request path.
        refresh = OpsService("probes", REFRESH_EVERY, probes.refresh)
        self.services = (*services, refresh) if self.addr else tuple(services)
        self._http: HttpServer | None = None
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self.bound: tuple[str, int] | None = None

    def start(self) -> None:
        if self.addr is not None:
            self._http = HttpServer(self.addr, self.routes)
            self.bound = self._http.start()
        self._spawn_thread("forklift-registry", self._heartbeat_loop)
        for service in self.services:
            self._spawn_thread(f"forklift-{service.name}", self._service_loop, service)

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
        """After fork: the child must keep none of the HTTP server's sockets."""
        if self._http is not None:
            self._http.close_in_child()

    def stop(self) -> None:
        """Stop both threads, then deregister (after any heartbeat still in flight)."""
        self._stopped.set()
        if self._http is not None:
            self._http.stop()
        for thread in self._threads:
            thread.join(timeout=10)
        with self.fork_lock:
            self.registry.deregister()
