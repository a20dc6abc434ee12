"""deploy/forklift.service as data: its settings, its command lines, a copy that points
at this machine, and the environment systemd would give its ExecStart."""

from __future__ import annotations

import getpass
import grp
import os
import re
import shlex
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.support import ROOT

# What the shipped unit names and the copy replaces with something that exists here.
BINARY = "/srv/app/.venv/bin/forklift"
APP = "myproject.jobs:app"
TEST_APP = "tests.apps.basic:app"


@dataclass(frozen=True)
class Unit:
    """A unit file's sections as ordered (key, value) pairs: keys may repeat (ExecStartPre)."""

    text: str
    sections: dict[str, list[tuple[str, str]]]

    @classmethod
    def read(cls, path: Path) -> Unit:
        sections: dict[str, list[tuple[str, str]]] = {}
        current: list[tuple[str, str]] = []
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                current = sections.setdefault(line[1:-1], [])
                continue
            key, sep, value = line.partition("=")
            assert sep, f"{path}: not a setting: {raw!r}"
            current.append((key.strip(), value.strip()))
        return cls(path.read_text(), sections)

    def all(self, key: str, section: str = "Service") -> list[str]:
        return [v for k, v in self.sections.get(section, []) if k == key]

    def get(self, key: str, section: str = "Service") -> str:
        values = self.all(key, section)
        assert values, f"[{section}] has no {key}="
        return values[-1]

    def seconds(self, key: str, section: str = "Service") -> float:
        """A time span setting (`45`, `45s`, `1min 30s`) in seconds."""
        units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "ms": 0.001}
        parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", self.get(key, section))
        return sum(float(n) * units[u] for n, u in parts)

    def commands(self, key: str) -> list[tuple[bool, list[str]]]:
        """An Exec setting's command lines: whether a failure is ignored (the "-"
        prefix), and the argv."""
        return [(v.startswith("-"), shlex.split(v.lstrip("-@:+!"))) for v in self.all(key)]

    def here(self, *, env_file: Path) -> str:
        """The unit's text pointed at this machine: the venv's forklift, the test app, and
        a user (this one: systemd-analyze warns of nobody), group, working directory and
        EnvironmentFile that exist."""
        user = getpass.getuser()
        group = grp.getgrgid(os.getgid()).gr_name
        text = self.text.replace(BINARY, str(Path(sys.executable).parent / "forklift"))
        text = text.replace(APP, TEST_APP)
        for key, value in (
            ("User", user),
            ("Group", group),
            ("WorkingDirectory", str(ROOT)),
            ("EnvironmentFile", str(env_file)),
        ):
            text = re.sub(rf"^{key}=.*$", f"{key}={value}", text, flags=re.M)
        return text


def systemd_environment(unit: Unit, env_file: Path, notify_socket: Path) -> dict[str, str]:
    """What systemd gives a service's processes: a minimal environment, its notify socket
    and watchdog, its Environment= and EnvironmentFile= settings (systemd.exec(5))."""
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "USER": getpass.getuser(),
        "LOGNAME": getpass.getuser(),
        "HOME": "/",
        "SHELL": "/usr/sbin/nologin",
        "NOTIFY_SOCKET": str(notify_socket),
        "WATCHDOG_USEC": str(int(unit.seconds("WatchdogSec") * 1e6)),
    }
    pairs = [pair for setting in unit.all("Environment") for pair in shlex.split(setting)]
    pairs += [
        line.strip()
        for line in env_file.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    for pair in pairs:
        key, _, value = pair.partition("=")
        env[key.strip()] = value.strip()
    return env


class NotifySocket:
    """The datagram socket systemd reads sd_notify messages from, held by a test."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[dict[str, str]] = []  # each one's KEY=VALUE lines
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.05)

    def received(self, key: str) -> dict[str, str] | None:
        """Read what has arrived; the first message so far that sets `key`."""
        try:
            while True:
                data = self._sock.recv(4096).decode()
                self.messages.append(dict(line.split("=", 1) for line in data.splitlines()))
        except TimeoutError:
            pass
        return next((m for m in self.messages if key in m), None)

    def close(self) -> None:
        self._sock.close()
