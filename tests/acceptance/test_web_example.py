"""examples/web end to end: its web server and a real supervisor as processes, driven over
real HTTP, both SIGTERMed mid-load and started again, and nothing lost."""

from __future__ import annotations

import http.client
import json
import random
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from signal import SIGTERM
from typing import Any, NamedTuple

import psycopg
import pytest

from forklift.testing import wait_for
from tests.acceptance.conftest import Proc, cli_json, get, metrics_url, scalar
from tests.acceptance.test_observability import samples

ROOT = Path(__file__).resolve().parents[2]
APP = "examples.web.app:app"
TASK = "render_thumbnail"
ORDERS = 200  # POSTs under load, over CLIENTS threads
CLIENTS = 4
STOP_AFTER = 50  # the web server and the supervisor get their SIGTERM once this many are in


class Web:
    """`python -m examples.web` in its own session, its output in a file."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "examples.web", "--addr", "127.0.0.1:0"],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def url(self) -> str:
        def listening() -> str | None:
            if self.popen.poll() is not None:
                pytest.fail(f"the web server exited:\n{self.output()[-3000:]}")
            match = re.search(r"listening on (http://[\d.]+:\d+)", self.output())
            return match[1] if match else None

        url: str = wait_for(listening, timeout=20, what="the web server listening")
        return url

    def stop(self) -> None:
        self.popen.send_signal(SIGTERM)
        self.wait_stopped()

    def wait_stopped(self) -> None:
        """Wait for its exit after a SIGTERM; require exit code 0."""
        code = self.popen.wait(timeout=30)
        assert code == 0, self.output()[-3000:]

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)


@pytest.fixture
def web(env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    servers: list[Web] = []

    def start() -> Web:
        server = Web(env, tmp_path / f"web-{len(servers)}.log")
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill()


def request(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, Any]:
    """One HTTP request: its status and its JSON body. Connection errors propagate."""
    req = urllib.request.Request(url, data=body, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def order(name: str, size: int) -> bytes:
    return json.dumps({"name": name, "size": size}).encode()


class Load:
    """Client threads POSTing orders, each with a name of its own, to whichever web server
    is up. A POST that gets no answer (connection refused or reset) is never retried: it
    is what must leave nothing behind. A client refused once waits for the next server."""

    def __init__(self, orders: list[tuple[str, int]], url: str) -> None:
        self._orders = iter(orders)
        self._lock = threading.Condition()
        self._url, self._generation = url, 0
        self.created: dict[str, dict[str, Any]] = {}  # name: the 201's body
        self.answered: dict[str, int] = {}  # name: any other status
        self.refused: list[str] = []
        self.threads = [threading.Thread(target=self._client) for _ in range(CLIENTS)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def switch_to(self, url: str) -> None:
        with self._lock:
            self._url, self._generation = url, self._generation + 1
            self._lock.notify_all()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            assert not thread.is_alive(), "a client did not finish its orders"

    def _take(self, generation: int) -> tuple[str, int, str, int] | None:
        """The next order, and the server to send it to once it is `generation` or later."""
        with self._lock:
            todo = next(self._orders, None)
            if todo is None:
                return None
            if not self._lock.wait_for(lambda: self._generation >= generation, timeout=60):
                return None
            return todo[0], todo[1], self._url, self._generation

    def _client(self) -> None:
        generation = 0  # the server this client may send to: refused once, the next one
        while (taken := self._take(generation)) is not None:
            name, size, url, used = taken
            try:
                status, body = request(url + "/thumbnails", "POST", order(name, size))
            except (urllib.error.URLError, ConnectionError, http.client.HTTPException):
                with self._lock:
                    self.refused.append(name)
                generation = used + 1
                continue
            with self._lock:
                if status == 201:
                    self.created[name] = body
                else:
                    self.answered[name] = status


def rows_by_name(db: psycopg.Connection[Any], schema: str) -> dict[str, tuple[int, int]]:
    rows = db.execute(f"SELECT name, id, job_id FROM {schema}.thumbnails").fetchall()
    return {name: (thumbnail_id, job_id) for name, thumbnail_id, job_id in rows}


def succeeded_total(url: str) -> float:
    return samples(get(url + "/metrics")[1], "forklift_jobs_total", outcome="succeeded", task=TASK)


def count(db: psycopg.Connection[Any], schema: str, where: str) -> int:
    return int(scalar(db, f"SELECT count(*) FROM {schema}.jobs WHERE {where}"))


class Stopped(NamedTuple):
    """What the SIGTERM of both processes found, and how long their stops took."""

    backlog: int  # jobs ready or running at the SIGTERM
    created: int  # 201s by then (the ones in flight included)
    in_flight: str  # requests the web server said it was finishing
    web_seconds: float
    supervisor_seconds: float


def stop_both(db: psycopg.Connection[Any], schema: str, web: Web, sup: Proc, load: Load) -> Stopped:
    """SIGTERM the web server and the supervisor together, mid-load; both exit 0."""
    stopping = time.monotonic()
    web.popen.send_signal(SIGTERM)
    sup.signal(SIGTERM)
    backlog = count(db, schema, "state IN ('ready', 'running')")
    web.wait_stopped()
    web_seconds = time.monotonic() - stopping
    assert sup.wait(timeout=30) == 0, sup.output()[-3000:]
    in_flight = re.findall(r"finishing (\d+) request", web.output())
    return Stopped(
        backlog, len(load.created), ",".join(in_flight), web_seconds, time.monotonic() - stopping
    )


def check_nothing_lost(db: psycopg.Connection[Any], schema: str, load: Load, url: str) -> None:
    """Every 201 has its row, one job and one render, and its GET says done with the job's
    result; every refused or otherwise answered POST left nothing."""
    rows = rows_by_name(db, schema)
    assert set(rows) == set(load.created), (
        f"rows without a 201: {sorted(set(rows) - set(load.created))[:5]}, "
        f"201s without a row: {sorted(set(load.created) - set(rows))[:5]}"
    )
    assert not set(rows) & set(load.refused)
    for name, body in load.created.items():
        assert (body["id"], body["job_id"]) == rows[name]
    # Exactly one job per row, and no job without a row.
    jobs = db.execute(
        f"SELECT (args->>'thumbnail_id')::bigint, count(*), min(id) FROM {schema}.jobs"
        " WHERE task = %s GROUP BY 1",
        (TASK,),
    ).fetchall()
    assert count(db, schema, "true") == len(rows)
    assert {t: (n, j) for t, n, j in jobs} == {t: (1, j) for t, j in rows.values()}
    # Exactly one render (the effect) per row, by that row's job.
    renders = db.execute(
        f"SELECT thumbnail_id, count(*), min(job_id), min(sha256) FROM {schema}.thumbnail_renders"
        " GROUP BY 1"
    ).fetchall()
    assert {t: (n, j) for t, n, j, _ in renders} == {t: (1, j) for t, j in rows.values()}
    digests = {t: sha for t, _, _, sha in renders}
    for name, body in load.created.items():
        status, shown = request(f"{url}/thumbnails/{body['id']}")
        assert status == 200, shown
        assert shown["state"] == "done" and shown["name"] == name
        assert shown["result"]["thumbnail_id"] == body["id"]
        assert shown["result"]["sha256"] == digests[body["id"]]


def test_posts_and_renders_survive_a_sigterm_of_web_and_supervisor_mid_load(
    env: dict[str, str], db: psycopg.Connection[Any], schema: str, forklift_cli: Any, web: Any
) -> None:
    started = time.monotonic()
    web1 = web()
    sup1 = forklift_cli("run", APP, "--workers", "2")
    url = web1.url()
    # One order first: the whole path works, and the supervisor's /metrics counts it.
    status, first = request(url + "/thumbnails", "POST", order("first.png", 64))
    assert status == 201, first
    wait_for(lambda: request(f"{url}/thumbnails/{first['id']}")[0] == 200, timeout=20, what="first")
    wait_for(lambda: succeeded_total(metrics_url(sup1)) == 1, what="the first job counted")

    rng = random.Random(21)
    load = Load([(f"img-{i}.png", rng.randint(48, 112)) for i in range(ORDERS)], url)
    load.created["first.png"] = first
    load.start()
    wait_for(lambda: len(load.created) > STOP_AFTER, timeout=30, what=f"{STOP_AFTER} POSTs in")
    stopped = stop_both(db, schema, web1, sup1, load)
    assert stopped.backlog > 0, "the supervisor had no work left when it was stopped"
    assert stopped.created < ORDERS, "every POST was in before the stop: not mid-load"
    # With the web server gone, the next POST of each client finds nobody listening.
    wait_for(lambda: load.refused, what="a POST refused while the web server is down")
    done_before = count(db, schema, "state = 'succeeded'")

    sup2 = forklift_cli("run", APP, "--workers", "2")
    web2 = web()
    url = web2.url()
    load.switch_to(url)
    load.join(timeout=60)
    wait_for(lambda: count(db, schema, "state <> 'succeeded'") == 0, timeout=90, what="all done")
    drained = time.monotonic() - started
    check_nothing_lost(db, schema, load, url)
    # The new supervisor's /metrics counts exactly the jobs it ran.
    ran_by_sup2 = len(load.created) - done_before
    metrics2 = metrics_url(sup2)
    wait_for(lambda: succeeded_total(metrics2) == ran_by_sup2, what="sup2's jobs counted")
    web2.stop()
    sup2.stop_cleanly()
    print(
        f"\n{len(load.created)} POSTs answered 201 ({stopped.created} before the SIGTERM), "
        f"{len(load.refused)} refused while stopped, {len(load.answered)} answered otherwise; "
        f"at the SIGTERM: {stopped.backlog} jobs ready or running, web finishing "
        f"{stopped.in_flight} request(s); web stopped in {stopped.web_seconds:.2f} s, "
        f"supervisor in {stopped.supervisor_seconds:.2f} s; {ran_by_sup2} jobs ran after "
        f"the restart; all done at {drained:.1f} s, test {time.monotonic() - started:.1f} s"
    )


BAD_ORDERS = [
    (b"not json", "not JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"name": "a.png"}', '"size"'),
    (b'{"name": "a.png", "size": 4096}', '"size"'),
    (b'{"name": "a.png", "size": 64.0}', '"size"'),
    (b'{"name": "a.png", "size": true}', '"size"'),
    (b'{"name": "", "size": 64}', '"name"'),
    (b'{"name": "a\\u0000b", "size": 64}', '"name"'),
    (b'{"name": 7, "size": 64}', '"name"'),
    (b'{"name": "a.png", "size": 64, "colour": "red"}', "unknown field(s): 'colour'"),
]


def test_bad_requests_are_refused_with_json_and_enqueue_nothing(
    env: dict[str, str], db: psycopg.Connection[Any], schema: str, web: Any
) -> None:
    server = web()
    url = server.url()
    for body, says in BAD_ORDERS:
        status, answer = request(url + "/thumbnails", "POST", body)
        assert status == 400 and says in answer["error"], (body, status, answer)
    # A body declared too big is refused before it is read.
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
    conn.putrequest("POST", "/thumbnails")
    conn.putheader("Content-Length", "100000")
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413 and "4096 bytes" in json.loads(resp.read())["error"]
    conn.close()
    assert request(url + "/thumbnails/1") == (404, {"error": "no thumbnail 1"})
    assert request(url + "/thumbnails/x")[0] == 404
    assert request(url + "/thumbnails", "GET")[0] == 405
    assert request(url + "/thumbnails/1", "DELETE")[0] == 405
    assert scalar(db, f"SELECT count(*) FROM {schema}.thumbnails") == 0
    assert scalar(db, f"SELECT count(*) FROM {schema}.jobs") == 0

    # With no worker running, a good order stays pending; a job that ends dead or
    # cancelled is answered 500 with its state, and no traceback.
    ids = [request(url + "/thumbnails", "POST", order(f"{n}.png", 32))[1] for n in "abc"]
    pending, dead, cancelled = ids
    status, shown = request(f"{url}/thumbnails/{pending['id']}")
    assert (status, shown["state"]) == (202, "pending")
    # No input makes a render fail: the job is marked dead as its last failed attempt
    # would leave it.
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'dead', last_error = %s WHERE id = %s",
        ("Traceback (most recent call last): ...", dead["job_id"]),
    )
    status, shown = request(f"{url}/thumbnails/{dead['id']}")
    assert (status, shown["state"]) == (500, "failed") and "Traceback" not in json.dumps(shown)
    assert cli_json(env, "jobs", "cancel", str(cancelled["job_id"]))[0]["result"] == "cancelled"
    status, shown = request(f"{url}/thumbnails/{cancelled['id']}")
    assert (status, shown["state"]) == (500, "cancelled")
    server.stop()
