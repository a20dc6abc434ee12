"""Debian's PgBouncer in front of a test cluster: its own config, port and log, in
transaction or session mode, recycling its server connections every few seconds."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

import psycopg

from forklift.testing import wait_for
from tests.tools import tool

CONFIG = """\
[databases]
* = host={host} port={port}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {dir}/users.txt
pool_mode = {mode}
server_lifetime = {lifetime}
server_idle_timeout = {lifetime}
max_client_conn = 500
default_pool_size = 20
logfile = {dir}/pgbouncer.log
pidfile = {dir}/pgbouncer.pid
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """`with PgBouncer(dsn, "transaction") as b:` then connect to `b.dsn`. PgBouncer will
    not run as root: it is started with `-u postgres` when root starts it."""

    def __init__(self, dsn: str, mode: str, *, server_lifetime: int = 3) -> None:
        self.binary = tool("pgbouncer", install="apt-get install pgbouncer (scripts/setup)")
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        self.user = str(info.get("user") or "postgres")
        self.target = (str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
        self.dbname = str(info.get("dbname") or self.user)
        self.mode = mode
        self.lifetime = server_lifetime
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="forklift-pgbouncer-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.dbname}"

    def __enter__(self) -> PgBouncer:
        self.dir.chmod(0o777)
        (self.dir / "users.txt").write_text(f'"{self.user}" ""\n')
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            CONFIG.format(
                host=self.target[0], port=self.target[1], listen=self.port, dir=self.dir,
                mode=self.mode, lifetime=self.lifetime,
            )
        )  # fmt: skip
        for path in self.dir.iterdir():
            path.chmod(0o644)
        cmd = [self.binary, str(ini)]
        if os.geteuid() == 0:
            cmd[1:1] = ["-u", "postgres"]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._answers, timeout=10, what="pgbouncer accepting connections")
        return self

    def _answers(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise AssertionError(f"pgbouncer exited: {self.log()}")
        try:
            with psycopg.connect(self.dsn, connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError:
            return False
        return True

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        for path in self.dir.iterdir():
            path.unlink()
        self.dir.rmdir()
