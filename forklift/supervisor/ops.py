"""The supervisor's one helper thread: /metrics, /healthz, /readyz and database chores.

Everything it does happens under `fork_lock`, which the main loop takes around each
fork: a child is never forked while this thread is mid-request or holds a connection.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from forklift._events import emit
from forklift.admin import AdminStore, QueueStats
from forklift.errors import ConfigError, DatabaseError
from forklift.metrics import Totals, TotalsCollector
from forklift.supervisor.store import SupervisorStore

if TYPE_CHECKING:
    from forklift.supervisor.arbiter import Supervisor

log = logging.getLogger(__name__)

GAUGE_TTL = 2.0  # queue gauges are read from the database at most this often
READY_TTL = 1.0
REGISTRY_EVERY = 5.0
STALE_AFTER = 20.0  # a process silent this long is gone (shorter than the default lease)


def parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:9090")
    return host.strip("[]") or "0.0.0.0", int(port)


@dataclass
class _Cached:
    value: object = None
    at: float = float("-inf")
    ok: bool = False


class Ops:
    def __init__(self, supervisor: Supervisor, totals: Totals, addr: str | None) -> None:
        self.sup = supervisor
        self.totals = totals
        self.addr = parse_addr(addr) if addr else None
        self.fork_lock = threading.Lock()
        self.admin = AdminStore(supervisor.app.dsn, supervisor.app.schema)
        self.store: SupervisorStore = supervisor.store
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(TotalsCollector(totals))
        self.registry.register(_LiveCollector(self))
        self._gauges = _Cached()
        self._db_ready = _Cached()
        self._next_registry = 0.0
        self._server: HTTPServer | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.bound: tuple[str, int] | None = None

    # -- lifecycle (main thread) -------------------------------------------------------

    def start(self) -> None:
        if self.addr is not None:
            handler = _handler_for(self)
            try:
                self._server = _Server(self.addr, handler, self)
            except OSError as exc:
                host, port = self.addr
                raise ConfigError(
                    f"cannot serve metrics on {host}:{port}: {exc.strerror or exc} "
                    "(choose another --metrics-addr, or 'off')"
                ) from None
            address = self._server.server_address
            self.bound = (str(address[0]), int(address[1]))
            emit(log, "supervisor.http", addr=f"{self.bound[0]}:{self.bound[1]}")
        self._thread = threading.Thread(target=self._serve, name="forklift-ops", daemon=True)
        self._thread.start()

    def close_in_child(self) -> None:
        """After fork: the child must not keep the parent's listening socket open."""
        if self._server is not None:
            self._server.socket.close()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        else:
            self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self.fork_lock:
            try:
                self.store.process_forget(self.sup.id, [])
            except DatabaseError:
                pass

    def _serve(self) -> None:
        if self._server is not None:
            self._server.serve_forever(poll_interval=0.5)
        else:
            while not self._stopped.wait(0.5):
                self.chores()

    # -- chores (ops thread) -----------------------------------------------------------

    def chores(self) -> None:
        now = time.monotonic()
        if now < self._next_registry:
            return
        self._next_registry = now + REGISTRY_EVERY
        with self.fork_lock:
            self._heartbeat_registry()

    def _heartbeat_registry(self) -> None:
        rows = self.sup.registry_rows()
        try:
            self.store.process_upsert_many(rows)
            self.store.process_forget(self.sup.id, [r.id for r in rows])
            pruned, charged = self.store.process_prune_stale(STALE_AFTER)
        except DatabaseError as exc:
            emit(log, "registry.heartbeat_failed", logging.WARNING, error=exc)
            return
        for pid in pruned:
            emit(log, "registry.pruned", logging.WARNING, process=pid)
        for job in charged:
            self.totals.job(job.queue, job.task, "crashed")
            emit(
                log,
                "job.dead" if job.state == "dead" else "job.failed",
                logging.WARNING,
                job=job.id,
                error="WorkerLost: its host stopped heart-beating",
            )

    # -- reads for HTTP (ops thread, under fork_lock) -----------------------------------

    def queue_stats(self) -> list[QueueStats] | None:
        now = time.monotonic()
        if now - self._gauges.at > GAUGE_TTL:
            try:
                self._gauges = _Cached(self.admin.queue_stats(throughput=False), now, True)
            except DatabaseError as exc:
                emit(log, "metrics.queue_stats_failed", logging.WARNING, error=exc)
                self._gauges = _Cached(None, now, False)
        return self._gauges.value if self._gauges.ok else None  # type: ignore[return-value]

    def database_ready(self) -> bool:
        now = time.monotonic()
        if now - self._db_ready.at > READY_TTL:
            try:
                self.admin.ping()
            except DatabaseError as exc:
                if self._db_ready.ok or self._db_ready.value is None:  # log changes only
                    emit(log, "supervisor.database_unreachable", logging.WARNING, error=exc)
                self._db_ready = _Cached(False, now, False)
            else:
                if not self._db_ready.ok and self._db_ready.value is not None:
                    emit(log, "supervisor.database_reachable")
                self._db_ready = _Cached(True, now, True)
        return self._db_ready.ok

    def health(self) -> tuple[int, str]:
        silent = time.monotonic() - self.sup.last_tick
        if silent > 10.0:
            return 503, f"supervisor loop stalled for {silent:.0f} s\n"
        return 200, "ok\n"

    def readiness(self) -> tuple[int, str]:
        reasons = []
        if self.sup.stopping:
            reasons.append("shutting down")
        if self.sup.crash_loop:
            reasons.append("workers are crash-looping")
        if self.sup.live_workers == 0:
            reasons.append("no worker process alive")
        if not self.database_ready():
            reasons.append("database unreachable")
        if reasons:
            return 503, "not ready: " + "; ".join(reasons) + "\n"
        return 200, "ready\n"


class _Server(HTTPServer):
    def __init__(
        self,
        addr: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        ops: Ops,
    ) -> None:
        self.ops = ops
        super().__init__(addr, handler)

    def service_actions(self) -> None:
        self.ops.chores()

    def _handle_request_noblock(self) -> None:
        # Accept, answer and close the client socket inside fork_lock: a child never
        # inherits a half-served connection.
        with self.ops.fork_lock:
            super()._handle_request_noblock()  # type: ignore[misc]


def _handler_for(ops: Ops) -> type[BaseHTTPRequestHandler]:
    routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
        "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(ops.registry)),
        "/healthz": lambda: _text(ops.health()),
        "/readyz": lambda: _text(ops.readiness()),
    }

    class Handler(BaseHTTPRequestHandler):
        timeout = 5.0  # a slow client cannot hold the ops thread

        def do_GET(self) -> None:
            route = routes.get(self.path.split("?", 1)[0])
            if route is None:
                status, ctype, body = 404, "text/plain", b"try /metrics, /healthz or /readyz\n"
            else:
                status, ctype, body = route()  # under fork_lock (see _Server)
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes every few seconds would drown the log

    return Handler


def _text(result: tuple[int, str]) -> tuple[int, str, bytes]:
    return result[0], "text/plain; charset=utf-8", result[1].encode()


class _LiveCollector(Collector):
    """Gauges read at scrape time: queue depth from the database, workers from the loop."""

    def __init__(self, ops: Ops) -> None:
        self.ops = ops

    def collect(self) -> Iterator[Metric]:
        stats = self.ops.queue_stats()
        depth = GaugeMetricFamily(
            "forklift_queue_depth", "Jobs per queue and state.", labels=["queue", "state"]
        )
        oldest = GaugeMetricFamily(
            "forklift_oldest_ready_age_seconds", "Age of the oldest due job.", labels=["queue"]
        )
        for s in stats or []:
            for state, n in (
                ("ready", s.ready),
                ("scheduled", s.scheduled),
                ("running", s.running),
                ("dead", s.dead),
            ):
                depth.add_metric([s.queue, state], n)
            oldest.add_metric([s.queue], s.oldest_ready_age)
        yield depth
        yield oldest
        workers = GaugeMetricFamily(
            "forklift_workers", "Worker processes by state.", labels=["state"]
        )
        busy, idle = self.ops.sup.worker_states()
        workers.add_metric(["busy"], busy)
        workers.add_metric(["idle"], idle)
        yield workers
        yield GaugeMetricFamily(
            "forklift_up", "1 while the supervisor is ready.", value=1 if self.ops.sup.ready else 0
        )
