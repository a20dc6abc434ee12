"""The supervisor: start children, reap them, attribute their deaths, keep their number.

It forks nothing but its fork server, before any of its threads starts; the fork server
forks the children, which the supervisor adopts (forkserver.py): so no process forks
with a thread besides its own.

The main loop is a short list of named steps (wait, read reports, dispatch signals,
reap, police, scale, keep the count); signal handlers only queue. Each step is a method
here or on a collaborator (Reaper, Police, Attribution, Scaling), built in __init__ and
callable on its own in a test.

What only the parent serves (/metrics and the probes, with prometheus_client and the
operator's store behind them) is imported and built once the first children are forked
(`served()`): they boot meanwhile, on the modules they share with the parent.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import select
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from setproctitle import setproctitle

from forklift import _db
from forklift._conns import HeldConnection
from forklift._events import emit
from forklift.app import App
from forklift.errors import ForkliftError
from forklift.metrics import Totals
from forklift.supervisor.child import Children, Signaller, send_signal
from forklift.supervisor.config import SupervisorConfig
from forklift.supervisor.dbthread import PACED, DbService, DbThread
from forklift.supervisor.deaths import Attribution, OnDbThread, VanishedOwners
from forklift.supervisor.exits import signal_name
from forklift.supervisor.forkserver import ForkServerLost
from forklift.supervisor.ops import MAINTAINER, OpsServer, maintenance_thread
from forklift.supervisor.police import Police
from forklift.supervisor.reaper import Reaper, settle_unanswered
from forklift.supervisor.refusals import BootCheck
from forklift.supervisor.registry import ProcessRegistry
from forklift.supervisor.reload import import_again
from forklift.supervisor.restarts import RestartSchedule
from forklift.supervisor.scaling import AUTOSCALE_EVERY, Scaling
from forklift.supervisor.session import HintFanout, SupervisorSession
from forklift.supervisor.signals import SignalQueue
from forklift.supervisor.snapshot import Identity, Snapshot, SnapshotBoard, take_snapshot
from forklift.supervisor.spawner import Spawner
from forklift.supervisor.states import RetireReason, StopMode
from forklift.supervisor.store import SupervisorStore
from forklift.supervisor.systemd import Notifier
from forklift.supervisor.title import supervisor_title

if TYPE_CHECKING:
    from forklift.supervisor.served import Served

log = logging.getLogger(__name__)

TICK = 0.25


class Supervisor:
    """The parent process. __init__ does no I/O; run() blocks until stopped, returns 0."""

    def __init__(
        self,
        app: App,
        config: SupervisorConfig | None = None,
        *,
        app_target: str | None = None,
        reimport: Callable[[str], App] | None = None,
        send: Signaller = send_signal,
    ) -> None:
        self.app = app
        self.config = cfg = config or SupervisorConfig()
        self.app_target = app_target
        self._reimport = reimport
        self.generation = 0  # bumped by a reload; older children are rolled
        self.stopping: StopMode | None = None
        self.identity = Identity("", "", os.getpid(), "", time.monotonic())  # set by run()
        self._told_ready = False
        self.children = Children(send)
        self.signals = SignalQueue()
        self.notifier = Notifier()
        self.totals = Totals(app.tasks)  # other task names share one label
        timeouts = _db.Timeouts.for_lease(cfg.worker.lease)
        # The parent's connections: the database thread's, the session's, and (on the
        # replica that maintains) maintenance's. All go to the session URL when there is
        # one (the workers' URL may be a pooler's).
        session_dsn = _db.session_dsn(app.dsn)
        held = HeldConnection(session_dsn, timeouts, "forklift-supervisor")
        self.store = SupervisorStore(app.dsn, app.schema, timeouts, held)
        self.attribution = Attribution(self.store, self.totals)
        self.fanout = HintFanout()
        # --no-listen: the session still LISTENs (for operators' orders) but forwards no
        # queue's news; the children poll.
        news_of = cfg.worker.queues if cfg.worker.listen else ()
        self.session = SupervisorSession(session_dsn, timeouts, app.schema, news_of, self.fanout)
        self.board = SnapshotBoard(Snapshot(last_tick=time.monotonic()))
        # Asked on the database thread, never before the port is bound or the first fork:
        # a database that never answers must not delay /healthz.
        self.boot = BootCheck(app.dsn, timeouts, held.connection, cfg.refused_grace)
        self.failure: ForkliftError | None = None  # why the supervisor gave up, if it did
        self.db = DbThread([DbService("boot", 0.5, self.boot.run_once), *self._db_services(cfg)])
        self.maintenance = maintenance_thread(
            app, cfg, HeldConnection(session_dsn, timeouts, MAINTAINER), self.session, self.totals,
            self.db,
        )  # fmt: skip
        deaths = OnDbThread(self.attribution, self.db.submit)
        self.restarts = RestartSchedule(self.notifier)
        settle = functools.partial(settle_unanswered, self.db.submit, self.store, self.totals)
        self.reaper = Reaper(self.children, deaths, self.totals, self.restarts, settle=settle)
        self.police = Police(cfg, self.children, deaths)
        self.ops = OpsServer(
            cfg.metrics_addr, self.registry, self.db, self.session, maintenance=self.maintenance
        )
        self._held, self._timeouts = held, timeouts  # for served()
        self._served: Served | None = None
        self.spawner = Spawner(
            cfg, self.children, self.signals, self.fanout, totals=self.totals,
            close_in_child=self.ops.close_in_child, vouch=self.session.vouch,
        )  # fmt: skip

    def _db_services(self, cfg: SupervisorConfig) -> list[DbService]:
        """What the database thread runs on its own schedule, each on the held connection."""
        self.scaling = Scaling(cfg, self.store)
        self.registry = ProcessRegistry(self.store, self.board)
        self.vanished = VanishedOwners(self.store, self.totals, me=lambda: self.identity.id)
        return [
            DbService("attribution", TICK, self.attribution.retry_deferred),
            self.vanished.service(),
            DbService("registry", self.registry.config.every, self.registry.run_once),
            DbService("autoscale", AUTOSCALE_EVERY, self.scaling.read_backlog, PACED),
        ]

    def served(self) -> Served:
        """What only the parent serves (served.py): built once, after the first fork."""
        from forklift.supervisor.served import serve

        where = (self.app.dsn, self.app.schema, self._timeouts, self._held)
        served = serve(where, self.app, self.config, self.totals, self.board)
        self.db.add(served.services)  # its rounds join the database thread's
        self._served = served
        return served

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        """Until stopped: 0; or the error that made it give up (a pooler's URL with no
        session URL, a database that refuses forklift since the start)."""
        self.identity = Identity.new(self.config.worker, time.monotonic())
        self.session.supervisor_id = self.identity.id  # its liveness lock vouches for all
        self.spawner.supervisor_id = self.identity.id
        self.signals.install()
        self.publish()
        self.ops.bind()  # a taken metrics address fails here, before any child exists
        # Preloaded objects stay on shared copy-on-write pages in children (no gc.collect()
        # first: ~10 ms on the way to the first claim, for next to nothing to free).
        gc.freeze()
        self.spawner.start(self.app, self.app_target, self._reimport)  # before any thread
        emit(
            log,
            "supervisor.started",
            pid=os.getpid(),
            workers=self.scaling.target,
            queues=",".join(self.config.worker.queues),
        )
        try:
            self.maintain_count()  # the first children, before the helper threads start
            self.ops.start_session()  # their liveness lock, before anything slower
            from forklift.supervisor.http import boot_routes  # waitress: the parent's only

            self.ops.serve(boot_routes())  # alive from now on, whatever the database does
            self.ops.start(self.served().routes)
            self._loop()
        finally:
            self.ops.stop()  # and deregisters this supervisor and its workers
            self.spawner.stop()
        emit(log, "supervisor.stopped", pid=os.getpid())
        if self.failure is not None:
            raise self.failure
        return 0

    def _loop(self) -> None:
        while True:
            self.notifier.tick(time.monotonic())
            self.maintain_count()
            self.tell_systemd()
            self.update_title()
            self.publish()
            self.wait()
            self.read_reports()
            self.dispatch_signals()
            self.give_up_if_refused()
            self.reaper.reap(stopping=self.stopping is not None)
            if self.stopping and not self.children:
                return
            now = time.monotonic()
            self.restarts.review(now, self.children)
            self.police.enforce_timeouts(now)
            self.police.enforce_cancels(now)
            self.police.enforce_memory(now)
            self.police.kill_unresponsive(now)
            self.police.escalate_kills(now)
            self.police.enforce_deadline(now)
            self.roll_reload()
            self.autoscale(now)

    def give_up_if_refused(self) -> None:
        """Stop now (exit 1, one line naming the cause) if the boot check found what no
        retry fixes: a pooler's URL without a session URL, or a database refusing
        forklift since the start for longer than --refused-grace."""
        if self.boot.fatal is not None and self.failure is None:
            self.failure = self.boot.fatal
            self.stop(fast=True)

    def publish(self) -> None:
        """Publish what the ops threads may see of this tick (health, readiness, registry)."""
        snapshot = take_snapshot(
            self.identity,
            self.children,
            stopping=self.stopping is not None,
            crash_loop=self.restarts.crash_loop,
            now=time.monotonic(),
        )
        self.board.publish(snapshot)
        if self.registry.changed(snapshot):  # a child came or went: heartbeat now
            self.db.submit("registry", self.registry.run_once)

    def tell_systemd(self) -> None:
        """READY=1 once the first full set of workers is up (Type=notify units)."""
        if not self._told_ready and len(self.children.live()) >= self.scaling.target:
            self._told_ready = True
            n = self.scaling.target
            self.notifier.ready(f"{n} worker{'' if n == 1 else 's'}")

    def update_title(self) -> None:
        cfg, children, db = self.config, self.children, self.db
        state = self.stopping or ("crash loop" if self.restarts.crash_loop else "running")
        state = "waiting for migrate" if state == "running" and db.waiting_for_migrate() else state
        target, busy = self.scaling.target, children.busy()
        setproctitle(supervisor_title(cfg.worker.queues, state, len(children), target, busy))

    def wait(self) -> None:
        """Sleep until a signal, a child report, or the next tick (or a restart is due)."""
        fds = [self.signals.read_fd, *self.children.pipes()]
        timeout = TICK
        restart_in = self.restarts.next_due(time.monotonic())
        if restart_in is not None:
            timeout = min(timeout, restart_in)
        try:
            readable, _, _ = select.select(fds, [], [], timeout)
        except (InterruptedError, OSError, ValueError):
            return
        if self.signals.read_fd in readable:
            self.signals.drain_pipe()

    def read_reports(self) -> None:
        now = time.monotonic()
        for child in self.children:
            try:
                child.read(now)
            except Exception:  # nothing a child sends may kill the supervisor (a bug here)
                log.exception("reading the reports of child %s failed", child.pid)
                child.count_malformed(1, b"")

    # -- signals ------------------------------------------------------------------------

    def dispatch_signals(self) -> None:
        while (signum := self.signals.pop()) is not None:
            name = signal_name(signum).lower()
            handler = getattr(self, f"handle_{name}", None)
            if handler is not None:
                handler()

    def handle_sigterm(self) -> None:
        self.stop(fast=False)

    def handle_sigint(self) -> None:
        self.stop(fast=self.stopping is not None)  # the second Ctrl-C is a fast stop

    def handle_sigquit(self) -> None:
        self.stop(fast=True)

    def handle_sighup(self) -> None:
        if self.stopping:
            return
        if self.app_target and self._reimport is not None:
            if (app := import_again(self.app_target, self._reimport, self.spawner.reload)) is None:
                return
            self.app = app
            if self._served is not None:
                self._served.scheduler.use(self.app.schedules.values())
            self.totals.declare(self.app.tasks)
        self.generation += 1
        emit(log, "supervisor.reload", generation=self.generation)

    def handle_sigttin(self) -> None:
        self.scaling.set_target(self.scaling.target + 1)

    def handle_sigttou(self) -> None:
        self.scaling.set_target(self.scaling.target - 1)

    def stop(self, *, fast: bool) -> None:
        """Begin (or hurry) shutdown: children finish within grace, the rest is released."""
        if self.stopping is StopMode.FAST or (self.stopping is StopMode.GRACEFUL and not fast):
            return
        self.stopping = mode = StopMode.FAST if fast else StopMode.GRACEFUL
        budget = self.config.stop_budget(mode)
        self.police.deadline = time.monotonic() + budget
        emit(
            log,
            "supervisor.stopping",
            mode=mode,
            children=len(self.children),
            deadline_in=round(budget, 1),
        )
        self.notifier.stopping(self.config.stop_timeout(mode))
        for child in self.children:
            child.retiring = child.retiring or RetireReason.SHUTDOWN
            self.children.signal(child, signal.SIGQUIT if fast else signal.SIGTERM)

    # -- the count ----------------------------------------------------------------------

    def maintain_count(self) -> None:
        """Start missing children, each slot after its own restart backoff; retire extra
        ones."""
        if self.stopping:
            return
        live = self.children.live()
        target = self.scaling.target
        if len(live) > target:
            for child in sorted(live, key=lambda c: c.started)[target:]:
                self.children.retire(child, RetireReason.SCALE_DOWN)
            return
        now = time.monotonic()
        # A child being killed or retired leaves its slot to its replacement at once.
        for slot in self.children.free_slots(target):
            if len(live) >= target:
                break
            if self.restarts.due(slot, now):
                try:
                    live.append(self.spawner.spawn(target, self.generation, slot))
                except ForkServerLost as exc:  # no child can start any more
                    self.failure = self.failure or exc
                    self.stop(fast=False)
                    return

    def roll_reload(self) -> None:
        """Replace children of an older generation one at a time (no job is dropped)."""
        if self.stopping:
            return
        if any(c.retiring is RetireReason.RELOAD for c in self.children):
            return
        stale = [c for c in self.children.live() if c.generation < self.generation]
        if stale:
            self.children.retire(min(stale, key=lambda c: c.started), RetireReason.RELOAD)

    def autoscale(self, now: float) -> None:
        if not self.stopping:
            self.scaling.autoscale(self.children.live(), now)
