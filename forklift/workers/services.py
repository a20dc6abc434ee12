"""The worker's background services, built after fork and wired to what they share."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass

from forklift import _db
from forklift._ids import application_name
from forklift.metrics import Tally
from forklift.shared_vouch import SharedVouch
from forklift.store import ClaimedJob, JobStore
from forklift.store.batches import BatchStore
from forklift.workers.batch_ends import BatchEnds, BatchSweep
from forklift.workers.cancels import Cancels
from forklift.workers.completer import Completer, CompleterConfig
from forklift.workers.config import WorkerConfig
from forklift.workers.events import JobEvents
from forklift.workers.holdings import Holdings
from forklift.workers.listener import Listener, PipeSource
from forklift.workers.liveness import LivenessLock
from forklift.workers.maintenance import Maintenance, MaintenanceConfig
from forklift.workers.progress import ProgressWriter
from forklift.workers.renewer import LeaseRenewer, RenewerConfig
from forklift.workers.wakeup import Wakeup


@dataclass(frozen=True)
class ServiceDeps:
    """What the services of one worker share, built by the worker after fork."""

    config: WorkerConfig
    store: JobStore
    dsn: str
    timeouts: _db.Timeouts
    owner: str
    holdings: Holdings
    events: JobEvents
    wakeup: Wakeup
    tally: Tally | None = None
    on_cancel: Callable[[ClaimedJob], None] | None = None
    # A supervisor's child: its hints come over this pipe, and its supervisor's liveness
    # lock vouches for it. None: a worker on its own, which LISTENs and locks itself.
    hints: PipeSource | None = None
    ends: BatchEnds | None = None  # told the batches of jobs completed
    vouch: SharedVouch | None = None  # a supervisor's child: whether its lock is held now


class Services:
    """The lease renewer, the completer, the listener (if it listens), the liveness lock
    (a worker on its own), maintenance (if configured) and the cancels of one worker.

    `start()` runs them on threads of their own. `stop()` ends them: the completer
    flushes what it was handed first, and the liveness lock goes last.
    """

    def __init__(self, deps: ServiceDeps) -> None:
        d, config = deps, deps.config
        self.closing = threading.Event()
        self.cancels = Cancels(d.store, d.holdings, d.events, d.on_cancel, lease=config.lease)
        d.events.on_refused = self.cancels.stopped
        self.renewer = LeaseRenewer(
            d.store, d.owner, d.holdings, d.events, d.tally, self.closing,
            RenewerConfig(config.lease), self.cancels,
        )  # fmt: skip
        self.completer = Completer(
            d.store, d.owner, d.holdings, d.events, self.closing,
            CompleterConfig(give_up_after=config.lease), d.ends,
        )  # fmt: skip
        self.listener = (
            Listener(
                d.store,
                _db.session_dsn(d.dsn),
                d.timeouts,
                config.queues,
                d.wakeup,
                self.closing,
                on_control=self.cancels.notice,
                source=d.hints,
            )
            if config.listen or d.hints is not None
            else None
        )
        self.maintenance = Maintenance(
            d.store,
            d.dsn,
            d.timeouts,
            MaintenanceConfig(config.maintenance_interval, config.keep_finished, config.keep_dead),
            sweep=BatchSweep.of(
                BatchStore(d.store.pool.connection, d.store.schema), d.tally, config
            ),
        )
        self.progress = ProgressWriter(d.store, d.owner, d.holdings, self.closing)
        self._maintain = config.maintenance
        session_dsn = _db.session_dsn(d.dsn)
        self._vouch = d.vouch
        self.liveness = (
            LivenessLock(
                session_dsn, d.timeouts, d.store.schema, d.owner, application_name(d.owner)
            )
            if d.hints is None
            else None
        )
        self._completing = threading.Thread(
            target=self.completer.run, name="forklift-completer", daemon=True
        )
        self._keeping = (
            threading.Thread(target=self.liveness.run, name="forklift-liveness", daemon=True)
            if self.liveness is not None
            else None
        )

    def wait_vouched(self, timeout: float) -> bool:
        """Whether a liveness lock vouches for this worker, waiting up to `timeout` s for
        it: its own, held on its own session; or, a supervisor's child, its supervisor's,
        as the supervisor's session last confirmed it (shared_vouch.py). A child told
        nothing of its supervisor's lock (built without one, in a test) is vouched for."""
        if self.liveness is not None:
            return self.liveness.wait_held(timeout)
        return self._vouch is None or self._vouch.wait(timeout)

    def start(self) -> None:
        threads = [
            threading.Thread(target=self.renewer.run, name="forklift-renewer", daemon=True),
            self._completing,
            threading.Thread(target=self.progress.run, name="forklift-progress", daemon=True),
        ]
        if self._keeping is not None:
            threads.insert(0, self._keeping)
        if self.listener is not None:
            threads.append(
                threading.Thread(target=self.listener.run, name="forklift-listener", daemon=True)
            )
        if self._maintain:
            run = functools.partial(self.maintenance.run, self.closing)
            threads.append(threading.Thread(target=run, name="forklift-maintenance", daemon=True))
        for t in threads:
            t.start()

    def stop(self, timeout: float) -> None:
        """Stop every service; wait up to `timeout` seconds for the completer's last flush."""
        self.closing.set()
        self.completer.stop()
        self._completing.join(timeout=timeout)
        # Last: a peer that saw the lock go before the completions were written would
        # charge jobs this worker is still finishing.
        if self.liveness is not None and self._keeping is not None:
            self.liveness.stop()
            self._keeping.join(timeout=timeout)
