"""The ops HTTP server answers GET and HEAD on its known paths, and nothing else."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator

import pytest

from forklift.metrics import Totals
from forklift.supervisor import http as ops_http
from forklift.supervisor.ops import OpsServer
from forklift.supervisor.probes import Probes, metrics_registry
from forklift.supervisor.registry import ProcessRegistry
from forklift.supervisor.snapshot import Snapshot, SnapshotBoard
from tests.unit.supervisor.conftest import FakeAdmin, FakeStore


class QuietRegistry(ProcessRegistry):
    def run_once(self) -> object:  # type: ignore[override]
        return None

    def deregister(self) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, int]]:
    board = SnapshotBoard(Snapshot(last_tick=time.monotonic(), live_workers=1))
    probes = Probes(board, FakeAdmin())
    registry = QuietRegistry(FakeStore(), board)
    ops = OpsServer("127.0.0.1:0", registry)
    ops.start(ops_http.routes_for(probes, metrics_registry(Totals(), probes)))
    probes.refresh()  # what the database thread does at once; here before the first request
    probes.refresh_stats()
    assert ops.bound is not None
    yield ops.bound
    ops.stop()


def ask(addr: tuple[str, int], method: str, path: str) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection(*addr, timeout=5)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.read(), dict(resp.getheaders())
    finally:
        conn.close()


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/readyz"])
def test_get_and_head_answer_on_the_known_paths(server: tuple[str, int], path: str) -> None:
    status, body, headers = ask(server, "GET", path)
    assert status == 200 and body
    head_status, head_body, head_headers = ask(server, "HEAD", path)
    assert head_status == 200 and head_body == b""
    assert head_headers["Content-Type"] == headers["Content-Type"]
    assert head_headers["Content-Length"] == str(len(body))
    assert "Server" not in headers and "Server" not in head_headers  # no versions shown


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "FOO"])
def test_any_other_method_is_405(server: tuple[str, int], method: str) -> None:
    status, _, headers = ask(server, method, "/metrics")
    assert status == 405
    assert headers["Allow"] == "GET, HEAD"


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST"])
@pytest.mark.parametrize("path", ["/", "/metrics/", "/admin", "/../etc/passwd", "/readyz/x"])
def test_an_unknown_path_is_404_whatever_the_method(
    server: tuple[str, int], method: str, path: str
) -> None:
    assert ask(server, method, path)[0] == 404


def test_the_server_binds_loopback_by_default() -> None:
    from forklift.supervisor.config import SupervisorConfig

    assert SupervisorConfig().metrics_addr in (None, "127.0.0.1:9367")
    from forklift.cli import build_parser

    args = build_parser().parse_args(["run", "x:app"])
    assert args.metrics_addr.startswith("127.0.0.1:")


def test_a_client_that_drips_is_cut_off_at_the_connection_deadline(
    server: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops_http, "CONNECTION_DEADLINE", 1.0)
    with socket.create_connection(server, timeout=5) as sock:
        sock.settimeout(0.3)
        deadline = time.monotonic() + 10
        closed = False
        while not closed and time.monotonic() < deadline:
            try:
                sock.send(b"G")  # never idle for waitress: one byte every 0.3 s
                closed = sock.recv(1024) == b""
            except TimeoutError:
                continue
            except OSError:
                closed = True
        assert closed, "a dripping client kept its connection past the deadline"
