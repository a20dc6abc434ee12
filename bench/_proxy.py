"""tests.acceptance.proxy's TCP proxy in a process of its own, driven over a pipe.

A bench that measures its own latency must not carry every worker's bytes on its own
GIL: `ProxyProcess.to(dsn)` starts `python -m bench._proxy HOST PORT`, which listens on
127.0.0.1 (it prints the port), forwards to HOST:PORT, and answers each line it reads
on stdin (`cut`, `stall`, `restore`) with `ok` once done. Closing its stdin ends it.
"""

from __future__ import annotations

import subprocess
import sys
from typing import IO

import psycopg

from bench._harness import REPO_ROOT


class ProxyProcess:
    """The proxy's process: `dsn_through(dsn)`, `cut()`, `restore()`, `close()`."""

    def __init__(self, host: str, port: int) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "bench._proxy", host, str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
        )
        self.port = int(self._out.readline())

    @classmethod
    def to(cls, dsn: str) -> ProxyProcess:
        """A proxy in front of the TCP server `dsn` names."""
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        return cls(str(info.get("host") or "127.0.0.1"), int(str(info.get("port") or 5432)))

    @property
    def _out(self) -> IO[str]:
        assert self.popen.stdout is not None
        return self.popen.stdout

    def dsn_through(self, dsn: str) -> str:
        """`dsn`, but connecting through this proxy."""
        return psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=str(self.port))

    def _say(self, command: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(command + "\n")
        self.popen.stdin.flush()
        answer = self._out.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"proxy: {command!r} answered {answer!r}")

    def cut(self) -> None:
        """Break every connection through it and refuse new ones (until restore())."""
        self._say("cut")

    def restore(self) -> None:
        self._say("restore")

    def close(self) -> None:
        if self.popen.stdin is not None:
            self.popen.stdin.close()
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)


def main() -> None:
    from tests.acceptance.proxy import Proxy

    proxy = Proxy((sys.argv[1], int(sys.argv[2])))
    print(proxy.port, flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command in ("cut", "stall", "restore"):
            getattr(proxy, command)()
            print("ok", flush=True)
        else:
            print(f"unknown command {command!r}", flush=True)
    proxy.cut()


if __name__ == "__main__":
    main()
