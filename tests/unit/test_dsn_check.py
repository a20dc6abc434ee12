"""A database URL that no PostgreSQL can be is refused before any connection, with
exit 2 and a line that says what to fix: another database's scheme, or a port that is
not a port (which libpq would take and refuse only when connecting, exit 1)."""

from __future__ import annotations

import pytest

from forklift import _db
from forklift.cli import main
from forklift.errors import DsnError

OTHER_SCHEMES = [
    "mysql://app:s3cretpw@db.internal/app",
    "sqlite:///var/lib/app.db",
    "MariaDB://app@db/app",
    "postgresq://app@db/app",  # a typo is no PostgreSQL URL either
]

BAD_PORTS = {
    "postgresql://h:99999/db": "port 99999 is out of range",
    "postgresql://h:0/db": "port 0 is out of range",
    "postgresql://app:pw@h:abc/db": "port is not a number from 1 to 65535",
    "postgresql://h:-1/db": "port is not a number from 1 to 65535",
    "postgresql://h1:5432,h2:65536/db": "port 65536 is out of range",
    "host=h port=abc dbname=app": "key=value string's port is not a number",
}


@pytest.mark.parametrize("dsn", OTHER_SCHEMES)
def test_another_databases_url_is_named_for_its_scheme(dsn: str) -> None:
    with pytest.raises(DsnError) as raised:
        _db.check_dsn(dsn)
    message = str(raised.value)
    scheme = dsn.partition("://")[0]
    assert f"scheme {scheme}:// is not PostgreSQL's" in message, message
    assert all(s in message for s in ("postgresql://", "postgres://", "key=value")), message
    assert "does not parse" not in message and "s3cretpw" not in message


@pytest.mark.parametrize("dsn", sorted(BAD_PORTS))
def test_a_port_that_is_no_port_is_a_dsn_error(dsn: str) -> None:
    with pytest.raises(DsnError, match=BAD_PORTS[dsn]):
        _db.check_dsn(dsn)


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://app@db:5432/app",
        "postgres://app@db:1/app",
        "postgresql://h1:5432,h2/app",  # the second host on the default port
        "postgresql:///app?host=/run/postgresql&port=65535",
        "host=db port=6432 dbname=app",
    ],
)
def test_good_urls_pass(dsn: str) -> None:
    assert _db.check_dsn(dsn) == dsn


@pytest.mark.parametrize(
    ("dsn", "said"),
    [
        ("mysql://app:s3cretpw@db.internal/app", "the database URL's scheme mysql://"),
        ("postgresql://127.0.0.1:99999/test", "the database URL's port 99999 is out of range"),
        ("postgresql://127.0.0.1:abc/test", "the database URL's port is not a number"),
    ],
)
def test_the_cli_exits_2_with_one_line_before_connecting(
    dsn: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--dsn", dsn]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"forklift: error: {said}") and err.count("\n") == 1, err
    assert not out and "s3cretpw" not in err
