"""The dashboard's server under clients that drip bytes or send nothing: /healthz still
answers, as the supervisor's does (test_http_slowloris.py)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from forklift.testing import ForkliftProcess, wait_for
from tests.acceptance.test_http_slowloris import DRIP_EVERY, hostile_clients, probe

_URL = re.compile(r"forklift dashboard: http://([\d.]+):(\d+)/ ")


def test_drip_fed_connections_freeze_no_dashboard(env: dict[str, str], tmp_path: Path) -> None:
    proc = ForkliftProcess(["dashboard", "--bind", "127.0.0.1:0"], env, tmp_path / "dash.log")
    try:

        def address() -> re.Match[str] | None:
            proc.check_alive()  # raises, with its output, if it exited
            return _URL.search(proc.output())

        host, port = wait_for(address, timeout=20, what="the dashboard's address").groups()
        url = f"http://{host}:{port}/healthz"
        assert probe(url)[0] == 200
        with hostile_clients(host, int(port), drips=220, idle=50):
            time.sleep(DRIP_EVERY)  # the drips have begun: every slow client holds a request
            probes = [probe(url) for _ in range(10)]
            print("dashboard /healthz under a slowloris (status, s):", probes)
            failed = [(status, round(took, 2)) for status, took in probes if status != 200]
            assert failed == [], f"{len(failed)} of {len(probes)} probes failed"
        assert proc.stop(timeout=10) == 0
    finally:
        proc.kill()
