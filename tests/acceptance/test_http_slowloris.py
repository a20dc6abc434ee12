"""Hostile HTTP clients and a silent database cannot freeze the supervisor: /healthz stays
fast, a dead worker is replaced on time, a stop keeps its budget, and a forked child keeps
none of the server's sockets."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from forklift.supervisor.config import SupervisorConfig
from forklift.testing import process_title, wait_for
from tests.acceptance.conftest import get, metrics_url
from tests.acceptance.proxy import Proxy

DRIP_EVERY = 2.0  # seconds between the bytes a slow client sends


def probe(url: str, timeout: float = 5.0) -> tuple[int, float]:
    """(status, seconds) of one GET; status 0 when it did not answer within `timeout`."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        status = err.code
    except OSError:
        status = 0
    return status, time.monotonic() - started


@contextmanager
def hostile_clients(host: str, port: int, drips: int, idle: int) -> Iterator[None]:
    """`drips` clients sending a request one byte every DRIP_EVERY s, and `idle` clients
    that connect and send nothing, for as long as the block runs."""
    stop = threading.Event()
    socks: list[socket.socket] = []

    def drip(sock: socket.socket) -> None:
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 10_000
        for byte in request:  # bounded: 10,000 bytes, ended by `stop` long before that
            if stop.wait(DRIP_EVERY):
                return
            try:
                sock.send(bytes([byte]))
            except OSError:
                return

    threads = []
    try:
        for _ in range(idle + drips):
            # Not waiting for the handshake: a full backlog must not stall the test itself.
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.connect_ex((host, port))
            socks.append(sock)
        for sock in socks[:drips]:
            threads.append(threading.Thread(target=drip, args=(sock,), daemon=True))
            threads[-1].start()
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
        for sock in socks:
            sock.close()


def server_socket_inodes(port: int) -> set[str]:
    """Inodes of every TCP socket whose local port is `port` (the listener, its clients)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def socket_inodes_of(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def test_slow_and_idle_clients_freeze_nothing(forklift_cli: Any) -> None:
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "2")
    url = metrics_url(sup)
    wait_for(lambda: get(url + "/readyz")[0] == 200, timeout=20, what="ready")
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with hostile_clients(host, int(port), drips=8, idle=100):
        time.sleep(DRIP_EVERY)  # the drips have begun: every slow client holds a request
        probes = [probe(url + "/healthz") for _ in range(10)]
        print("healthz under a slowloris (status, s):", [(s, round(t, 3)) for s, t in probes])
        # A liveness bound, not a speed goal: a server one slow client can hold never answers.
        assert all(status == 200 and took < 1.0 for status, took in probes), probes

        before = sup.children()
        victim = before[0]
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        kids = wait_for(
            lambda: (k := sup.children()) and len(k) == 2 and victim not in k and k,
            timeout=10,
            what="the SIGKILLed worker replaced",
        )
        (replacement,) = set(kids) - set(before)
        print(f"worker replaced {time.monotonic() - killed:.2f} s after its SIGKILL")
        # Forked while a hundred clients were connected: once booted (its title set, after
        # the fork's clean-up), it holds none of their sockets.
        wait_for(
            lambda: process_title(replacement).startswith("forklift worker"),
            what="the replacement booted",
        )
        held = socket_inodes_of(replacement) & server_socket_inodes(int(port))
        assert not held, f"the child {replacement} holds the server's sockets {held}"

        budget = SupervisorConfig().shutdown_budget
        took = sup.stop_cleanly(timeout=budget)
        print(f"stopped {took:.2f} s after SIGTERM (budget {budget:.0f} s)")
    assert "Traceback" not in sup.output()


def test_an_early_disconnect_is_no_traceback_and_no_server_version(forklift_cli: Any) -> None:
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    url = metrics_url(sup)
    wait_for(lambda: get(url + "/readyz")[0] == 200, timeout=20, what="ready")
    host, port = url.removeprefix("http://").rsplit(":", 1)
    for _ in range(20):  # ask, then hang up before the answer is read
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
    with urllib.request.urlopen(url + "/healthz", timeout=5) as resp:
        assert resp.headers.get("Server") is None
    sup.stop_cleanly(timeout=30)
    assert "Traceback" not in sup.output()
    assert "BrokenPipe" not in sup.output()


def test_healthz_answers_while_the_database_never_answers(
    dsn: str, db: psycopg.Connection[Any], forklift_cli: Any, env: dict[str, str]
) -> None:
    proxy = Proxy.to(dsn)
    env["FORKLIFT_DATABASE_URL"] = proxy.dsn_through(dsn)
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    url = metrics_url(sup)
    wait_for(lambda: get(url + "/readyz")[0] == 200, timeout=20, what="ready")
    proxy.stall()  # connections are accepted and then nothing ever comes back
    try:
        wait_for(lambda: get(url + "/readyz")[0] == 503, timeout=20, what="not ready")
        probes = [probe(url + "/healthz") for _ in range(10)]
        print("healthz with a silent database (status, s):", [(s, round(t, 3)) for s, t in probes])
        assert all(status == 200 and took < 1.0 for status, took in probes), probes
        status, took = probe(url + "/readyz")
        print(f"readyz with a silent database: {status} in {took:.3f} s")
        assert status == 503 and took < 1.0
    finally:
        proxy.restore()
    sup.stop_cleanly(timeout=SupervisorConfig().shutdown_budget)
    proxy.cut()


def test_a_death_and_a_stop_while_the_database_never_answers(
    dsn: str, forklift_cli: Any, env: dict[str, str]
) -> None:
    """The loop hands the death's database work to its database thread and goes on:
    the replacement is forked at once, /healthz answers, and the stop keeps its budget
    though the database thread is stuck waiting on the silent database."""
    proxy = Proxy.to(dsn)
    env["FORKLIFT_DATABASE_URL"] = proxy.dsn_through(dsn)
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    url = metrics_url(sup)
    wait_for(lambda: get(url + "/readyz")[0] == 200, timeout=20, what="ready")
    [victim] = wait_for(lambda: sup.children(), timeout=10, what="a worker")
    proxy.stall()
    try:
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: (kids := sup.children()) and victim not in kids,
            timeout=5,
            interval=0.01,
            what="a replacement",
        )
        replaced = time.monotonic() - killed
        print(f"replaced {replaced:.3f} s after the SIGKILL, the database silent")
        status, took = probe(url + "/healthz")
        assert status == 200 and took < 1.0
        budget = SupervisorConfig().shutdown_budget
        took = sup.stop_cleanly(timeout=budget)
        print(f"stopped {took:.2f} s after SIGTERM, the database silent (budget {budget:.0f} s)")
    finally:
        proxy.restore()
        proxy.cut()
