"""sd_notify without a dependency: READY, STOPPING, EXTEND_TIMEOUT_USEC and WATCHDOG."""

from __future__ import annotations

import os
import socket
import time


class Notifier:
    """Talks to systemd when started with Type=notify (NOTIFY_SOCKET set); else a no-op."""

    def __init__(self) -> None:
        address = os.environ.get("NOTIFY_SOCKET", "")
        self.address = "\0" + address[1:] if address.startswith("@") else address
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        watched = usec.isdigit() and (not pid or pid == str(os.getpid()))
        # Ping twice per watchdog period, as sd_watchdog_enabled(3) advises.
        self.watchdog_every = int(usec) / 2e6 if watched else None
        self._next_ping = 0.0

    def send(self, *lines: str) -> None:
        if not self.address:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self.address)
                sock.sendall("\n".join(lines).encode())
        except OSError:
            pass  # systemd gone or socket not ours: nothing to tell

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def stopping(self, budget: float) -> None:
        self.send("STOPPING=1", f"EXTEND_TIMEOUT_USEC={int(budget * 1e6)}")

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def tick(self, now: float | None = None) -> None:
        """Call from the main loop: pings the watchdog when one is configured and due."""
        if self.watchdog_every is None:
            return
        now = time.monotonic() if now is None else now
        if now >= self._next_ping:
            self.send("WATCHDOG=1")
            self._next_ping = now + self.watchdog_every
