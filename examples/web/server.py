"""The web side of the example: a WSGI app on the standard library's wsgiref, stopped
gracefully by SIGTERM.

    POST /thumbnails       {"name": "cat.png", "size": 128} -> 201 {"id": 7, "job_id": 42, ...}
    GET  /thumbnails/<id>  202 pending, 200 with the job's result, 500 if the job is dead

The row and its job are inserted in the request's own transaction, on the web app's own
connection pool (`render_thumbnail.enqueue(conn=conn, ...)`): both commit or neither
does, so a request that fails half-way leaves no row without a job, no job without a row.

wsgiref serves each connection on a thread of its own, one request per connection; it is
the standard library's, not a hardened server (no limit on connections). The WSGI app
itself runs unchanged under waitress or gunicorn, which have their own graceful stops.
"""

from __future__ import annotations

import json
import logging
import signal
import socketserver
import threading
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, NamedTuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

import forklift
from examples.web.app import MAX_SIZE, MIN_SIZE, app, create_tables, render_thumbnail

if TYPE_CHECKING:
    from collections.abc import Iterable

    from _typeshed.wsgi import StartResponse, WSGIEnvironment

log = logging.getLogger("examples.web")

POOL_SIZE = 8  # connections the requests share; more requests at once wait for one
POOL_WAIT = 5.0  # seconds a request waits for a connection before it is answered 503
REQUEST_TIMEOUT = 10.0  # seconds a client may stall mid-request (it bounds a stop, too)
MAX_BODY = 4096  # bytes
MAX_NAME = 200  # characters
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
RETRY = (("Retry-After", "1"),)  # on 202 and 503: ask again in a second

INSERT_THUMBNAIL = 'INSERT INTO "{schema}".thumbnails (name, size) VALUES (%s, %s) RETURNING id'
SET_JOB = 'UPDATE "{schema}".thumbnails SET job_id = %s WHERE id = %s'
GET_THUMBNAIL = """
SELECT t.name, t.size, t.job_id, r.sha256, r.mean_brightness
FROM "{schema}".thumbnails AS t LEFT JOIN "{schema}".thumbnail_renders AS r
    ON r.thumbnail_id = t.id
WHERE t.id = %s
"""


class Answer(NamedTuple):
    """What a request is answered: a status, a JSON body, and any headers beside them."""

    status: int
    body: dict[str, Any]
    headers: tuple[tuple[str, str], ...] = ()


class BadRequest(Exception):
    """The request cannot be served as sent (the message says why)."""

    def __init__(self, message: str, status: int = 400, *headers: tuple[str, str]) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


def parse_order(body: bytes) -> tuple[str, int]:
    """The name and size a POST asks for; BadRequest saying what is wrong otherwise."""
    try:
        order = json.loads(body)
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON ({exc})") from None
    if not isinstance(order, dict):
        raise BadRequest('the body must be a JSON object: {"name": "...", "size": 128}')
    unknown = sorted(set(order) - {"name", "size"})
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(map(repr, unknown))}")
    name, size = order.get("name"), order.get("size")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME or not name.isprintable():
        raise BadRequest(f'"name" must be a string of 1 to {MAX_NAME} printable characters')
    if not isinstance(size, int) or isinstance(size, bool) or not MIN_SIZE <= size <= MAX_SIZE:
        raise BadRequest(f'"size" must be an integer from {MIN_SIZE} to {MAX_SIZE}')
    return name, size


def read_body(environ: WSGIEnvironment) -> bytes:
    """The request's body, at most MAX_BODY bytes (413 past it)."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = -1
    if length < 0:
        raise BadRequest("Content-Length must be a number of bytes")
    if length > MAX_BODY:
        raise BadRequest(f"the body may be {MAX_BODY} bytes at most", 413)
    try:
        body: bytes = environ["wsgi.input"].read(length)
    except OSError:  # the client stalled past REQUEST_TIMEOUT, or went away
        raise BadRequest("the body did not arrive") from None
    return body


class Thumbnails:
    """The WSGI application: routes, JSON in and out, errors as JSON."""

    def __init__(self, pool: ConnectionPool[psycopg.Connection[Any]]) -> None:
        self.pool = pool
        self.in_flight = 0  # requests inside the app right now (logged when stopping)
        self._lock = threading.Lock()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        with self._lock:
            self.in_flight += 1
        try:
            status, body, extra = self.answer(environ)
        finally:
            with self._lock:
                self.in_flight -= 1
        payload = json.dumps(body).encode() + b"\n"
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))]
        start_response(f"{status} {HTTPStatus(status).phrase}", [*headers, *extra])
        return [payload]

    def answer(self, environ: WSGIEnvironment) -> Answer:
        method = environ.get("REQUEST_METHOD", "GET")
        parts = environ.get("PATH_INFO", "").strip("/").split("/")
        try:
            if parts == ["thumbnails"]:
                if method != "POST":
                    raise BadRequest("use POST to create a thumbnail", 405, ("Allow", "POST"))
                return self.create(*parse_order(read_body(environ)))
            if len(parts) == 2 and parts[0] == "thumbnails" and parts[1].isdigit():
                if method != "GET":
                    raise BadRequest("use GET to read a thumbnail", 405, ("Allow", "GET"))
                return self.show(int(parts[1]))
            raise BadRequest("try POST /thumbnails or GET /thumbnails/<id>", 404)
        except BadRequest as exc:
            return Answer(exc.status, {"error": str(exc)}, exc.headers)
        except (PoolTimeout, psycopg.OperationalError, forklift.DatabaseError) as exc:
            log.warning("database unavailable: %s", exc)
            return Answer(503, {"error": "the database is unavailable, try again"}, RETRY)
        except Exception:
            log.exception("%s %s failed", method, environ.get("PATH_INFO"))
            return Answer(500, {"error": "internal error"})

    def create(self, name: str, size: int) -> Answer:
        """The row and its job, committed together (or neither, on any error)."""
        with self.pool.connection() as conn, conn.transaction():
            row = conn.execute(INSERT_THUMBNAIL.format(schema=app.schema), (name, size)).fetchone()
            assert row is not None  # INSERT ... RETURNING: one row
            thumbnail_id = row[0]
            job_id = render_thumbnail.enqueue(
                conn=conn, thumbnail_id=thumbnail_id, name=name, size=size
            )
            conn.execute(SET_JOB.format(schema=app.schema), (job_id, thumbnail_id))
        body = {"id": thumbnail_id, "job_id": job_id, "state": "pending"}
        return Answer(201, body, (("Location", f"/thumbnails/{thumbnail_id}"),))

    def show(self, thumbnail_id: int) -> Answer:
        """From the row and its job: pending, done (with the job's result) or failed."""
        with self.pool.connection() as conn:
            row = conn.execute(GET_THUMBNAIL.format(schema=app.schema), (thumbnail_id,)).fetchone()
        if row is None:
            return Answer(404, {"error": f"no thumbnail {thumbnail_id}"})
        name, size, job_id, sha256, mean = row
        about = {"id": thumbnail_id, "name": name, "size": size, "job_id": job_id}
        try:
            result = app.result(job_id, timeout=0)  # 0: look, never wait
        except TimeoutError:
            return Answer(202, {**about, "state": "pending"}, RETRY)
        except forklift.JobFailed:
            # The job's error stays with the operator (`forklift jobs show ID`): it may
            # hold a traceback, which is nothing to hand to a client.
            return Answer(500, {**about, "state": "failed", "error": "rendering failed"})
        except forklift.JobCancelled:
            return Answer(500, {**about, "state": "cancelled", "error": "rendering was cancelled"})
        except forklift.JobNotFound:
            # Finished jobs are pruned after their retention; the render row stays.
            if sha256 is None:
                return Answer(500, {**about, "state": "failed", "error": "no render stored"})
            result = {"thumbnail_id": thumbnail_id, "size": size, "sha256": sha256}
            result["mean"] = round(mean, 2)
        return Answer(200, {**about, "state": "done", "result": result})


class Server(socketserver.ThreadingMixIn, WSGIServer):
    """wsgiref's server, a thread per connection; server_close() joins those threads."""

    daemon_threads = False
    block_on_close = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that stalls or hangs up is its own business: one line, no traceback.
        log.info("connection from %s:%s ended early", *client_address[:2])


class Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT  # on the socket: a stalled client cannot hold a stop forever

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no line per request


def serve(host: str, port: int) -> None:
    """Migrate, create the tables, serve until SIGTERM or SIGINT, then stop gracefully:
    accept no new connection, finish the requests in flight, close the pools."""
    # The stop signals are blocked before any thread starts, so every thread (the request
    # threads, the pools') inherits that, and only sigwait() below ever takes them.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    app.migrate()  # forklift's tables (a no-op when they are current), then the app's
    pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
        app.dsn,
        min_size=2,
        max_size=POOL_SIZE,
        timeout=POOL_WAIT,
        kwargs={"connect_timeout": 5, "options": "-c statement_timeout=5000"},
        open=False,
        name="examples.web",
    )
    pool.open(wait=True, timeout=10)
    with pool.connection() as conn:
        create_tables(conn)
    thumbnails = Thumbnails(pool)
    try:
        server = make_server(host, port, thumbnails, server_class=Server, handler_class=Handler)
    except OSError as exc:
        pool.close()
        raise SystemExit(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    accepting = threading.Thread(target=server.serve_forever, args=(0.1,), name="accept")
    accepting.start()
    bound_host, bound_port = server.server_address[:2]
    log.info("listening on http://%s:%s", bound_host, bound_port)

    signum = signal.sigwait(STOP_SIGNALS)
    log.info(
        "%s: accepting no more connections, finishing %d request(s) in flight",
        signal.Signals(signum).name,
        thumbnails.in_flight,
    )
    server.shutdown()  # the accept loop ends
    accepting.join()
    server.server_close()  # the listener closes, then every request thread is joined
    pool.close()
    app.close()
    log.info("stopped")
