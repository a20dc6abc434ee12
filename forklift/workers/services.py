"""The worker's background services, built after fork and wired to what they share."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

from forklift import _db
from forklift._ids import application_name
from forklift.metrics import Tally
from forklift.store import ClaimedJob, JobStore
from forklift.workers.cancels import Cancels
from forklift.workers.completer import Completer, CompleterConfig
from forklift.workers.config import WorkerConfig
from forklift.workers.events import JobEvents
from forklift.workers.holdings import Holdings
from forklift.workers.listener import Listener
from forklift.workers.liveness import LivenessLock
from forklift.workers.maintenance import Maintenance, MaintenanceConfig
from forklift.workers.renewer import LeaseRenewer, RenewerConfig
from forklift.workers.wakeup import Wakeup


class Services:
    """The lease renewer, the completer, the listener (if it listens), the liveness lock,
    maintenance and the cancels of one worker, each configured from the WorkerConfig and
    given its collaborators.

    `start()` runs the renewer, the completer, the listener, the liveness lock and (if
    configured) maintenance on threads of their own. `stop()` ends them: the
    completer flushes what it was handed first, and the liveness lock goes last.
    """

    def __init__(
        self,
        config: WorkerConfig,
        store: JobStore,
        dsn: str,
        timeouts: _db.Timeouts,
        owner: str,
        holdings: Holdings,
        events: JobEvents,
        wakeup: Wakeup,
        tally: Tally | None,
        on_cancel: Callable[[ClaimedJob], None] | None = None,
    ) -> None:
        self.closing = threading.Event()
        self.cancels = Cancels(store, holdings, events, on_cancel)
        self.renewer = LeaseRenewer(
            store,
            owner,
            holdings,
            events,
            tally,
            self.closing,
            RenewerConfig(config.lease),
            self.cancels,
        )
        self.completer = Completer(
            store,
            owner,
            holdings,
            events,
            self.closing,
            CompleterConfig(give_up_after=config.lease),
        )
        self.listener = (
            Listener(
                store,
                dsn,
                timeouts,
                config.queues,
                wakeup,
                self.closing,
                on_control=self.cancels.notice,
            )
            if config.listen
            else None
        )
        self.maintenance = Maintenance(
            store,
            dsn,
            timeouts,
            MaintenanceConfig(config.maintenance_interval, config.keep_finished, config.keep_dead),
        )
        self._maintain = config.maintenance
        self.liveness = LivenessLock(dsn, timeouts, store.schema, owner, application_name(owner))
        self._completing = threading.Thread(
            target=self.completer.run, name="forklift-completer", daemon=True
        )
        self._keeping = threading.Thread(
            target=self.liveness.run, name="forklift-liveness", daemon=True
        )

    def start(self) -> None:
        threads = [
            self._keeping,
            threading.Thread(target=self.renewer.run, name="forklift-heartbeat", daemon=True),
            self._completing,
        ]
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
        self.liveness.stop()
        self._keeping.join(timeout=timeout)
