"""Database connections: DSN lookup and checks, per-connection timeouts, pools, DSN redaction."""

from __future__ import annotations

import os
import re
import select
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg.rows import RowMaker, class_row, dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from forklift import _redact
from forklift._redact import redact as redact
from forklift._redact import secrets as secrets
from forklift.errors import ConfigError, DatabaseError, DsnError, NoDatabase, transient_state

R = TypeVar("R")


# -- rows by name -----------------------------------------------------------------------
# A statement's result is read through one of these: each row as a dataclass whose fields
# are the statement's column names (psycopg's class_row), or the one column of a
# statement that returns one. They take the statement's cursor (conn.execute's, or one
# of a pipeline's) and set its row factory before reading it.


def scalar_row(cursor: psycopg.Cursor[Any]) -> RowMaker[Any]:
    """A row factory for a statement of one column: each row is that column's value (a
    statement of more columns raises ValueError)."""

    def value(values: Sequence[Any]) -> Any:
        (only,) = values
        return only

    return value


def scalars(cursor: psycopg.Cursor[Any]) -> list[Any]:
    """The value of each row of `cursor`'s one-column statement."""
    cursor.row_factory = scalar_row
    return cursor.fetchall()


def scalar(cursor: psycopg.Cursor[Any]) -> Any:
    """The value of the first row of `cursor`'s one-column statement; None if no row."""
    cursor.row_factory = scalar_row
    return cursor.fetchone()


def column(cursor: psycopg.Cursor[Any], name: str) -> list[Any]:
    """The column `name` of each row of `cursor`'s statement (its other columns unread)."""
    cursor.row_factory = dict_row
    return [row[name] for row in cursor.fetchall()]


def count(cursor: psycopg.Cursor[Any]) -> int:
    """The number `cursor`'s statement of one row and one column counted (0: no row)."""
    return int(scalar(cursor) or 0)


def rows(cursor: psycopg.Cursor[Any], row: type[R]) -> list[R]:
    """Each row of `cursor`'s statement as a `row`: its fields are the column names."""
    cursor.row_factory = class_row(row)
    return cursor.fetchall()


def one(cursor: psycopg.Cursor[Any], row: type[R]) -> R | None:
    """The first row of `cursor`'s statement as a `row` (rows); None if no row."""
    cursor.row_factory = class_row(row)
    return cursor.fetchone()


# -- errors: unavailable (try again) or refused (report) ---------------------------------


def transient(exc: BaseException) -> bool:
    """Whether trying again what raised `exc` may succeed: the database was unavailable,
    as against refusing the operation. Every retry loop asks this, and retries only what
    it says yes to; a refusal is reported instead.

    Unavailable: no answer at all (the connection failed or was lost, no pooled
    connection came: psycopg's OperationalError and InterfaceError without a SQLSTATE, or
    a socket's OSError), or an answer of a class trying again cures (transient_state:
    connection exceptions, admin shutdown, a statement cancelled, the server starting,
    too many connections, a serialization failure or deadlock). Refused: every other
    answer, as psycopg's classes sort them: DataError, IntegrityError, ProgrammingError
    (syntax, privileges), NotSupportedError, authentication (class 28). A DatabaseError
    answers as its cause was classified; any other exception is no database's answer and
    not transient."""
    if isinstance(exc, DatabaseError):
        return exc.transient
    if isinstance(exc, psycopg.Error):
        if exc.sqlstate is not None:
            return transient_state(exc.sqlstate)
        # psycopg's own: the connection failed, or it refused a value or a statement
        # before sending it.
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    return isinstance(exc, OSError)


def database_error(
    message: str, exc: BaseException, kind: type[DatabaseError] = DatabaseError
) -> DatabaseError:
    """A `kind` saying `message`, raised from `exc`: its SQLSTATE and class kept, its
    `transient` as `transient(exc)` says, `row_dependent` if the values a statement was
    given caused it (a data exception or an integrity violation, SQLSTATE class 22 or
    23, the server's or psycopg's own)."""
    state = exc.sqlstate if isinstance(exc, psycopg.Error) else None
    rows = isinstance(exc, psycopg.DataError | psycopg.IntegrityError) or (
        state is not None and state[:2] in ("22", "23")
    )
    return kind(message, sqlstate=state, transient=transient(exc), row_dependent=rows, cause=exc)


NO_DATABASE = "no database: pass App(dsn=...) or set FORKLIFT_DATABASE_URL (or DATABASE_URL)"


def resolve_dsn(dsn: str | None) -> str:
    """The DSN given, else FORKLIFT_DATABASE_URL, else DATABASE_URL, else the project's
    development database (forklift.devdb) where it may be used; DsnError if it does not
    parse (check_dsn), NoDatabase (saying why there is no development database) if none."""
    found = dsn or os.environ.get("FORKLIFT_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if found:
        return check_dsn(found)
    from forklift import devdb

    try:
        return devdb.dsn()
    except NoDatabase as exc:
        raise NoDatabase(NO_DATABASE, reason=str(exc)) from None


@dataclass(frozen=True)
class Timeouts:
    """Bounds on every database call, in seconds; all well below the lease.

    The keepalive settings apply on both ends of a TCP connection (libpq's and the
    server's): an idle connection is probed after `keepalive_idle` seconds, then every
    `keepalive_interval`, and dropped after `keepalive_count` probes go unanswered; data
    left unacknowledged for `tcp_user` seconds drops it too. So a host that vanishes
    (power, a partition) frees its sessions, and the locks their transactions hold,
    within seconds to a minute, while a brief network stall breaks nothing.
    """

    connect: float = 5.0
    statement: float = 10.0
    lock: float = 5.0
    idle_in_transaction: float = 20.0
    keepalive_idle: float = 10.0
    keepalive_interval: float = 5.0
    keepalive_count: int = 3
    tcp_user: float = 30.0

    @classmethod
    def for_lease(cls, lease: float) -> Timeouts:
        """Timeouts that keep any single call within a third of the lease.

        libpq waits at least 2 s to connect whatever it is told, so leases under 6 s get
        that floor on the connect timeout only. A dead peer is given up on within about
        a lease (10 s at least: a stall of a few seconds is no death; a minute at most).
        """
        return cls(
            connect=min(5.0, max(2.0, lease / 3)),
            statement=min(10.0, lease / 3),
            lock=min(5.0, lease / 4),
            idle_in_transaction=min(60.0, lease * 2 / 3),
            keepalive_idle=min(30.0, max(5.0, lease / 3)),
            keepalive_interval=min(10.0, max(2.0, lease / 6)),
            keepalive_count=3,
            tcp_user=min(60.0, max(10.0, lease)),
        )

    def options(self) -> str:
        """The server side of these bounds, as libpq's `options` (-c name=value)."""
        settings = {
            "statement_timeout": int(self.statement * 1000),
            "lock_timeout": int(self.lock * 1000),
            "idle_in_transaction_session_timeout": int(self.idle_in_transaction * 1000),
            "tcp_keepalives_idle": round(self.keepalive_idle),
            "tcp_keepalives_interval": round(self.keepalive_interval),
            "tcp_keepalives_count": self.keepalive_count,
            "tcp_user_timeout": int(self.tcp_user * 1000),
        }
        return " ".join(f"-c {k}={v}" for k, v in settings.items())

    def set_config(self, *, local: bool) -> str:
        """One statement that sets the server side of these bounds: for the transaction
        (`local`, how they reach a transaction-mode pooler's backend) or the session."""
        settings = {
            "statement_timeout": int(self.statement * 1000),
            "lock_timeout": int(self.lock * 1000),
            "idle_in_transaction_session_timeout": int(self.idle_in_transaction * 1000),
        }
        flag = "true" if local else "false"
        calls = ", ".join(f"set_config('{k}', '{v}', {flag})" for k, v in settings.items())
        return f"SELECT {calls}"

    def client(self) -> dict[str, Any]:
        """The client side of these bounds, as libpq connection parameters."""
        return {
            "connect_timeout": max(2, round(self.connect)),
            "keepalives": 1,
            "keepalives_idle": round(self.keepalive_idle),
            "keepalives_interval": round(self.keepalive_interval),
            "keepalives_count": self.keepalive_count,
            "tcp_user_timeout": int(self.tcp_user * 1000),
        }


def describe(dsn: str) -> str:
    """Where `dsn` points, for error messages: `user@host:port/dbname` (never a password)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "an unparsable DSN"
    host = str(info.get("host") or os.environ.get("PGHOST") or "localhost")
    port = str(info.get("port") or os.environ.get("PGPORT") or 5432)
    user = str(info.get("user") or os.environ.get("PGUSER") or "")
    dbname = str(info.get("dbname") or user)
    return redact(f"{user + '@' if user else ''}{host}:{port}/{dbname}")


def probe(dsn: str, timeouts: Timeouts) -> None:
    """Connect once, or raise DatabaseError saying where and why, within the connect
    timeout (a pool would retry quietly and time out with no cause); DsnError, before
    any attempt, if `dsn` does not parse."""
    check_dsn(dsn)
    try:
        detect_pooler(dsn, timeouts)  # its connection, if it makes one, is the probe's first
        with psycopg.connect(dsn, **connect_kwargs(timeouts, "forklift-probe", dsn)):
            pass
    except (psycopg.Error, DatabaseError) as found:
        # One wait for a database that does not answer, not one per connection.
        exc = found.__cause__ if isinstance(found.__cause__, psycopg.Error) else found
        cause = " ".join(str(exc).split()) or type(exc).__name__
        raise database_error(
            f"cannot connect to PostgreSQL at {describe(dsn)}: {redact(cause)} "
            "(the database comes from --dsn, FORKLIFT_DATABASE_URL or DATABASE_URL)",
            exc,
        ) from exc


def connect_kwargs(
    timeouts: Timeouts,
    application_name: str = "forklift",
    dsn: str | None = None,
    *,
    own: bool = True,
) -> dict[str, Any]:
    """libpq's parameters for a bounded connection; behind a pooler (`pooled(dsn)`), no
    startup options (it refuses or drops them) and no server-side prepared statements
    (a transaction-mode pooler hands each transaction to any backend).

    `own`: a connection for forklift's own statements, with JIT off. They are short, but
    a claim under limits or a prune estimated past jit_above_cost on a big table would
    be compiled each time: 0.4 s of JIT for a 12 ms claim (a rate of 500/s would start
    335/s with 40,000 jobs ready). Handlers' effect connections keep the server's setting."""
    kwargs: dict[str, Any] = {**timeouts.client(), "application_name": application_name}
    if dsn is not None and pooled(dsn):
        kwargs["prepare_threshold"] = None
    else:
        kwargs["options"] = timeouts.options() + (" -c jit=off" if own else "")
    return kwargs


def connect(
    dsn: str, timeouts: Timeouts, *, autocommit: bool = True, application_name: str = "forklift"
) -> psycopg.Connection[Any]:
    """One bounded connection (for LISTEN, migrations, advisory locks). Behind a pooler
    its bounds are set once the session starts (a session-mode pooler resets them when
    the client leaves)."""
    if dsn not in _POOLED:
        try:
            detect_pooler(dsn, timeouts)
        except DatabaseError:
            pass  # the connect below says why
    conn = psycopg.connect(
        dsn, autocommit=autocommit, **connect_kwargs(timeouts, application_name, dsn)
    )
    if pooled(dsn):
        try:
            conn.execute(timeouts.set_config(local=False))
            if not autocommit:
                conn.commit()
        except BaseException:
            conn.close()
            raise
    return conn


# -- connection poolers (PgBouncer) ---------------------------------------------------

SESSION_URL_ENV = "FORKLIFT_SESSION_DATABASE_URL"

# DSN -> whether it leads through a pooler that refuses or drops startup options.
_POOLED: dict[str, bool] = {}


def session_dsn(dsn: str) -> str:
    """Where session-level work goes (LISTEN, liveness and singleton locks, the
    supervisor's own statements): FORKLIFT_SESSION_DATABASE_URL when set (a direct URL,
    or one through a session-mode pooler), else `dsn` itself."""
    return os.environ.get(SESSION_URL_ENV) or dsn


def pooled(dsn: str) -> bool:
    """Whether `dsn` was found to lead through a connection pooler (`detect_pooler`)."""
    return _POOLED.get(dsn, False)


def detect_pooler(dsn: str, timeouts: Timeouts) -> bool:
    """Whether `dsn` leads through a connection pooler such as PgBouncer, found by the
    startup options forklift sends: refused (`unsupported startup parameter`) or dropped
    (the statement timeout reads 0). Asked once per DSN and process; DatabaseError if the
    database cannot be reached at all."""
    if dsn in _POOLED:
        return _POOLED[dsn]
    kwargs = {**timeouts.client(), "options": timeouts.options(), "application_name": "forklift"}
    try:
        with psycopg.connect(dsn, autocommit=True, **kwargs) as conn:
            found = bool(scalar(conn.execute("SHOW statement_timeout")) == "0")
    except psycopg.OperationalError as exc:
        if "unsupported startup parameter" not in str(exc):
            cause = " ".join(str(exc).split()) or type(exc).__name__
            raise database_error(
                f"cannot connect to PostgreSQL at {describe(dsn)}: {redact(cause)}", exc
            ) from exc
        found = True
    _POOLED[dsn] = found
    return found


def needs_session_url(dsn: str, timeouts: Timeouts, who: str) -> None:
    """Refuse to run `who` (a supervisor, a worker of its own, a singleton) through a
    pooler without a session URL: through a transaction-mode one its LISTEN and advisory
    locks would land on whichever backend serves each statement. (A session-mode pooler
    cannot be told apart: name it as the session URL too.)"""
    if not os.environ.get(SESSION_URL_ENV) and detect_pooler(dsn, timeouts):
        raise ConfigError(
            f"{who}: the database URL ({describe(dsn)}) goes through a connection pooler "
            "(it refused or dropped forklift's startup options, as PgBouncer does): set "
            f"{SESSION_URL_ENV} to a direct URL, or one through a session-mode pooler, for "
            "LISTEN and advisory locks (see README, PgBouncer)"
        )


# psycopg_pool retries a failed connection attempt on a schedule of its own (1, 2, 4 s,
# ...) until reconnect_timeout: after a 20 s outage the first claim would wait ~8 s for
# that schedule though the database had long been back. Instead each attempt gives up
# after 0.3 s and LivePool starts the next at once (its reconnect_failed hook), so a
# connection comes within a third of a second of the database taking one again.
RECONNECT_GIVE_UP = 0.3


def looks_alive(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """False if the connection is known dead, or its socket has something to say while
    idle (a terminated backend's FATAL error, or EOF): no round trip, one poll."""
    if conn.closed or conn.broken:
        return False
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    except (OSError, ValueError, psycopg.Error):
        return False


class LivePool(ConnectionPool[psycopg.Connection[Any]]):
    """psycopg_pool's pool, handing out no connection whose session already ended.

    After a failover or a pg_terminate_backend storm every idle connection is dead, and
    none may fail a claim. Each checkout polls the connection's socket (a syscall; a
    round trip per checkout cost a third of the no-op throughput): an ended session has
    its FATAL message or EOF waiting there. The first dead one drains the pool, since
    what ended one idle session has usually ended them all; psycopg_pool reconnects in
    the background, and the caller takes a fresh connection.
    """

    def __init__(self, conninfo: str, *, set_local: str | None = None, **kwargs: Any) -> None:
        super().__init__(
            conninfo,
            reconnect_timeout=RECONNECT_GIVE_UP,
            reconnect_failed=LivePool._try_again,
            **kwargs,
        )
        # Behind a transaction pooler: each use is one transaction that sets its bounds.
        self.set_local = set_local

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        with super().connection(timeout) as conn:
            if self.set_local is None:
                yield conn
                return
            with conn.transaction():
                conn.execute(self.set_local)
                yield conn

    @staticmethod
    def _try_again(pool: ConnectionPool[Any]) -> None:
        # check() lets an empty pool grow again: the next attempt starts now.
        if not pool.closed:
            pool.check()

    def getconn(self, timeout: float | None = None) -> psycopg.Connection[Any]:
        """A live connection within `timeout` seconds (the pool's own when None), however
        many dead ones it finds on the way."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        conn = super().getconn(timeout)
        if looks_alive(conn):
            return conn
        conn.close()
        self.putconn(conn)  # closed: the pool replaces it
        self.drain()
        return super().getconn(max(0.0, deadline - time.monotonic()))


class LiveAsyncPool(AsyncConnectionPool[psycopg.AsyncConnection[Any]]):
    """LivePool for asyncio: no connection whose session already ended, and a quick
    reconnect; for async handlers' effect transactions (workers/aio.py)."""

    def __init__(self, conninfo: str, *, set_local: str | None = None, **kwargs: Any) -> None:
        super().__init__(
            conninfo,
            reconnect_timeout=RECONNECT_GIVE_UP,
            reconnect_failed=LiveAsyncPool._try_again,
            **kwargs,
        )
        self.set_local = set_local

    @staticmethod
    async def _try_again(pool: AsyncConnectionPool[Any]) -> None:
        if not pool.closed:
            await pool.check()

    async def getconn(self, timeout: float | None = None) -> psycopg.AsyncConnection[Any]:
        conn = await super().getconn(timeout)
        if looks_alive(conn):
            return conn
        await conn.close()
        await self.putconn(conn)  # closed: the pool replaces it
        await self.drain()
        return await super().getconn(timeout)


def make_async_pool(
    dsn: str, timeouts: Timeouts, *, max_size: int, name: str, application_name: str
) -> LiveAsyncPool:
    """make_pool's async twin, lazy (min_size 0) and closed: open it on its loop."""
    return LiveAsyncPool(
        dsn,
        set_local=timeouts.set_config(local=True) if pooled(dsn) else None,
        min_size=0,
        max_size=max_size,
        kwargs={"autocommit": True, **connect_kwargs(timeouts, application_name, dsn, own=False)},
        timeout=timeouts.connect * 2,
        name=name,
        open=False,
    )


def make_pool(
    dsn: str,
    timeouts: Timeouts,
    *,
    max_size: int,
    name: str,
    application_name: str = "forklift",
    min_size: int = 1,
    own: bool = True,
) -> LivePool:
    """A closed pool of autocommit connections; the caller opens it (after any fork).
    With `min_size` 0 it connects only when a connection is first asked for. `own`:
    for forklift's statements, not handlers' effects (connect_kwargs)."""
    return LivePool(
        dsn,
        set_local=timeouts.set_config(local=True) if pooled(dsn) else None,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True, **connect_kwargs(timeouts, application_name, dsn, own=own)},
        timeout=timeouts.connect * 2,
        name=name,
        open=False,
    )


# Pieces of a password shorter than this are not hidden on their own (they would hide
# ordinary words everywhere, and say little of the password).
_SECRET_PIECE = 4
_CHECKED: set[str] = set()
_URL_FORM = re.compile(r"^\s*postgres(?:ql)?://", re.IGNORECASE)
_KV_VALUE = re.compile(
    r"password\s*=\s*('(?:[^'\\]|\\.)*'?|.*?)(?=\s+\w+\s*=|\s*$)", re.IGNORECASE | re.DOTALL
)
_URL_HINT = (
    "percent-encode special characters in the password and user name "
    "(space %20, @ %40, : %3A, / %2F, % %25)"
)
_KV_HINT = (
    "quote a value with spaces in single quotes, as in dbname='my db', with \\' and \\\\ inside"
)
_WHERE = "(the database comes from --dsn, FORKLIFT_DATABASE_URL or DATABASE_URL)"
# A URL's scheme, of any database: letters, digits, + . - (RFC 3986), bounded, so that
# showing it can never show a password.
_SCHEME = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.-]{0,31})://")
_PORTS = range(1, 65536)


def _passwords(dsn: str) -> list[str]:
    """The password(s) `dsn` holds as its writer meant them, parsed or not: for a URL,
    everything between the user's colon and the last @ (an unencoded @ or space in it
    is what breaks the parse); for key=value, each password= value."""
    if _URL_FORM.match(dsn):
        rest = dsn.partition("://")[2]
        head = rest.partition("?")[0]
        userinfo = (head if "@" in head else rest).rpartition("@")[0]
        found = [userinfo.partition(":")[2]] if ":" in userinfo else []
    else:
        found = [m.group(1).strip("'") for m in _KV_VALUE.finditer(dsn)]
    return [p for p in found if p]


def remember_secrets(dsn: str) -> None:
    """Have redact() hide the password of a malformed `dsn` wherever it appears as a
    word: whole, percent-decoded, parsed, and each piece of it between spaces, @, :, /
    and quotes. A DSN that parses shows its password only inside a DSN, where redact()
    finds it anyway: hiding it everywhere hid every word that happens to match it."""
    if _well_formed(dsn):
        return
    found = _passwords(dsn)
    found += [urllib.parse.unquote(p) for p in found]
    try:
        found.append(str(psycopg.conninfo.conninfo_to_dict(dsn).get("password") or ""))
    except psycopg.ProgrammingError:
        pass
    pieces = {*found, *(piece for p in found for piece in re.split(r"[\s@:/'\"\\]+", p))}
    _redact.hide(p for p in pieces if len(p) >= _SECRET_PIECE)


def _well_formed(dsn: str) -> bool:
    """Whether `dsn` parses, with no @ in its host (an unencoded @ in a URL's password
    ends the password early, and the rest of it becomes the host)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return False
    return "@" not in str(info.get("host") or "")


def check_dsn(dsn: str) -> str:
    """`dsn` if it parses as a libpq URL or key=value string, else DsnError saying which
    form failed and how to write it. The parser's own message is never shown: it quotes
    the part it choked on, which is usually the password."""
    if dsn in _CHECKED:
        return dsn
    remember_secrets(dsn)
    _check_scheme(dsn)
    url = bool(_URL_FORM.match(dsn))
    form, hint = ("URL", _URL_HINT) if url else ("key=value string", _KV_HINT)
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise DsnError(f"the database {form} does not parse: {hint} {_WHERE}") from None
    if "@" in str(info.get("host") or ""):
        # An unencoded @ in a URL's password ends the password early: the rest of it
        # becomes the host name, which every connection error would then print.
        raise DsnError(f"the database {form}'s host contains '@': {hint} {_WHERE}")
    _check_ports(str(info.get("port") or ""), form)
    _CHECKED.add(dsn)
    return dsn


def _check_scheme(dsn: str) -> None:
    """DsnError for another database's URL (mysql://, sqlite:///...): libpq reads anything
    but postgresql:// and postgres:// as a key=value string, and would say that the
    string does not parse, which sends its writer to fix the wrong thing."""
    scheme = _SCHEME.match(dsn)
    if scheme is not None and not _URL_FORM.match(dsn):
        raise DsnError(
            f"the database URL's scheme {scheme[1]}:// is not PostgreSQL's: forklift takes a "
            "postgresql:// or postgres:// URL, or a key=value string such as "
            f"'host=db.internal dbname=app' {_WHERE}"
        )


def _check_ports(ports: str, form: str) -> None:
    """DsnError for a port that is not a number from 1 to 65535 (one per host, comma
    separated; an empty one means the default). libpq takes any text here and refuses it
    only when connecting, an error that reads as a database that is away. A port that is
    not a number is not shown: in a mistyped URL it may be a piece of the password."""
    for port in (p.strip() for p in ports.split(",")):
        if not port:
            continue
        if not (port.isascii() and port.isdigit()):
            raise DsnError(f"the database {form}'s port is not a number from 1 to 65535 {_WHERE}")
        if int(port) not in _PORTS:
            raise DsnError(
                f"the database {form}'s port {port} is out of range: ports run from 1 to "
                f"65535 {_WHERE}"
            )
