"""What `forklift dashboard` is told: where to listen, whether actions are allowed, the
token that guards them; and the refusals and warnings that follow from those."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from forklift.errors import ConfigError

DEFAULT_BIND = "127.0.0.1:8787"
TOKEN_ENV = "FORKLIFT_DASHBOARD_TOKEN"
MIN_TOKEN = 16  # characters: a token is a password anyone who reaches the port may guess


@dataclass(frozen=True)
class DashboardConfig:
    """The dashboard's settings, checked (`checked()`)."""

    host: str
    port: int
    allow_actions: bool = False
    token: str | None = None  # every page needs a login with it; actions need it

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def checked(self) -> list[str]:
        """Raise ConfigError for what must not start; the warnings for what may."""
        if self.token is not None and len(self.token) < MIN_TOKEN:
            raise ConfigError(f"{TOKEN_ENV} must be at least {MIN_TOKEN} characters long")
        if self.allow_actions and self.token is None:
            raise ConfigError(
                f"--allow-actions needs a login token: set {TOKEN_ENV} (at least "
                f"{MIN_TOKEN} characters; every page then asks for it)"
            )
        if self.allow_actions and not self.loopback:
            raise ConfigError(
                f"--allow-actions serves only on a loopback address, not {self.host}: bind "
                "127.0.0.1 (the default) and reach it through an SSH tunnel or "
                "`kubectl port-forward`, which arrive on the loopback"
            )
        if self.token is None and not self.loopback:
            return [
                f"serving {self.host}:{self.port} without {TOKEN_ENV}: anyone who can reach "
                "this address reads every queue, job argument (secrets hidden) and error; "
                f"set {TOKEN_ENV} to require a login"
            ]
        return []


def parse_bind(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:8787` for IPv6; port 0 picks a free one) as (host, port);
    ConfigError saying how to write it."""
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--bind {text!r}: expected HOST:PORT, such as {DEFAULT_BIND}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name) reaches only this machine: every address it
    resolves to is a loopback one. A name that does not resolve is not."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    addresses = [ipaddress.ip_address(str(a).split("%")[0]) for a in found]
    return bool(addresses) and all(a.is_loopback for a in addresses)
