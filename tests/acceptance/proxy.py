"""A TCP proxy in front of PostgreSQL that a test can cut, stall and restore.

`cut()` is a database outage as a client sees it when the network drops its connections:
open ones break, new ones are refused. `stall()` is a network that stops carrying bytes
without telling anyone (a partition, a dead switch): connections stay open and are even
accepted, but nothing reaches the other side until `restore()`.
"""

from __future__ import annotations

import socket
import threading

import psycopg


class Proxy:
    """Listens on 127.0.0.1 and forwards to PostgreSQL (over TCP or its Unix socket)."""

    def __init__(self, target: tuple[str, int] | str) -> None:
        self.target = target
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self.restore()

    @classmethod
    def to(cls, dsn: str) -> Proxy:
        """A proxy in front of the server `dsn` names."""
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        host, port = str(info.get("host") or "127.0.0.1"), int(str(info.get("port") or 5432))
        return cls(f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port))

    def dsn_through(self, dsn: str) -> str:
        """`dsn`, but connecting through this proxy."""
        return psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=str(self.port))

    def _connect_upstream(self) -> socket.socket:
        if isinstance(self.target, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            try:
                sock.connect(self.target)
            except OSError:
                sock.close()
                raise
            return sock
        return socket.create_connection(self.target, timeout=5)

    def restore(self) -> None:
        """Accept connections again (on the same port) and carry bytes again."""
        self._flowing.set()
        if self._listener is not None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stall(self) -> None:
        """Stop carrying bytes either way; connections stay open (until `restore()`)."""
        self._flowing.clear()

    @property
    def stalled(self) -> bool:
        return not self._flowing.is_set()

    def cut(self) -> None:
        """Refuse new connections and break every open one."""
        with self._lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            for conn in self._conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
            self._conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = self._connect_upstream()
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            # While stalled, bytes wait in the kernel's buffers: TCP backs off as it would
            # behind a partition, and nothing is lost or reordered once it is restored.
            while self._flowing.wait() and (data := src.recv(65536)):
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
