"""A malformed DSN through the real `forklift` CLI: every command, `forklift run` included,
stops at once with exit 2 and one line, and the password is nowhere, --debug or not."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys

import pytest

from forklift import _db, _redact

# Each breaks libpq's parse, or ends the password early so that its rest becomes the host
# (which every connection error would print); all point at the test server otherwise.
HOSTILE = {
    "url-space": "postgresql://root:TOP SECRET@127.0.0.1:5432/test",
    "url-at": "postgresql://root:SECRET@x@127.0.0.1:5432/test",
    "url-at-tail": "postgresql://root:TOP@SECRET@127.0.0.1:5432/test",
    "key-value": "host=127.0.0.1 port=5432 dbname=test user=root password=TOP SECRET",
}

COMMANDS = (
    ["status"],
    ["jobs", "list"],
    ["jobs", "show", "1"],
    ["ps"],
    ["queues"],
    ["schedules"],
    ["top", "--once"],
    ["migrate"],
    ["enqueue", "tests.apps.basic:app", "noop"],
    ["run", "tests.apps.basic:app", "--workers", "1"],
    ["worker", "tests.apps.basic:app"],
    ["demo", "--no-kill"],
)


def forklift(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "forklift", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"forklift {' '.join(args)} kept running (retrying?): {exc.stderr!r}")


def assert_refused(
    result: subprocess.CompletedProcess[str], command: list[str], *, debug: bool = False
) -> None:
    said = result.stdout + result.stderr
    assert "SECRET" not in said, f"{command[0]}: {said}"  # (the command may hold the DSN)
    said = f"forklift {' '.join(command)}: {said}"
    assert result.returncode == 2, said
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("forklift: error: the database "), said
    assert "percent-encode" in lines[-1] or "single quotes" in lines[-1], said
    if debug:
        assert "Traceback" in result.stderr, said
    else:
        assert len(lines) == 1 and not result.stdout, said


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_malformed_dsn_stops_every_command_with_exit_2_and_no_secret(
    env: dict[str, str], name: str
) -> None:
    hostile = {**env, "FORKLIFT_DATABASE_URL": HOSTILE[name]}
    runs = [(command, hostile, False) for command in COMMANDS]
    # From --dsn too, and with --debug the traceback says no more.
    for command in (["status"], ["run", "tests.apps.basic:app", "--workers", "1"]):
        runs += [
            ([*command, "--dsn", HOSTILE[name]], env, False),
            ([*command, "--debug"], hostile, True),
        ]
    # Each command in a process of its own, a few at once: they wait on nothing of each
    # other's (a host name that is half a password may take a while to fail to resolve).
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda run: forklift(run[0], run[1]), runs))
    for (command, _, debug), result in zip(runs, results, strict=True):
        assert_refused(result, command, debug=debug)


def test_the_redactor_hides_a_malformed_dsns_password_wherever_it_appears(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_redact, "_SECRETS", ())  # this test's passwords stay in this test
    _db.remember_secrets("postgresql://u:Hunter2@Tail x@db.example.com/app")
    _db.remember_secrets("host=db password=quoted zork'quux dbname=app")
    text = _db.redact(
        "failed to resolve host 'Tail x@db.example.com'; unexpected spaces in \"Hunter2@Tail "
        'x"; missing "=" after "zork\'quux"; quoted zork\'quux'
    )
    assert "Hunter2" not in text and "Tail" not in text and "zork'quux" not in text, text
    assert "db.example.com" in text  # what is no password stays
    # A well-formed DSN's password is hidden where it stands, not as a word elsewhere.
    _db.remember_secrets("postgresql://u:Sesame42@db.example.com/app")
    assert (
        _db.redact("postgresql://u:Sesame42@db/app; Sesame42")
        == "postgresql://u:***@db/app; Sesame42"
    )
