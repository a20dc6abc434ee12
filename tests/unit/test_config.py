"""Config value parsers, DSN lookup and redaction, and lease-derived timeouts."""

from __future__ import annotations

import argparse

import pytest

import forklift
from forklift import _config, _db, _redact


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("10s", 10.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("2d", 172800.0),
        ("1.5", 1.5),
        ("10", 10.0),
        ("0", 0.0),
        ("0.5s", 0.5),
        (" 30s ", 30.0),
        ("1.5m", 90.0),
    ],
)
def test_duration_parses(text: str, seconds: float) -> None:
    assert _config.duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["abc", "-1s", "-1", "10x", "", "s", "1 s s", "1.5.2s", "1e3", "nan", "inf", "10S"]
)
def test_duration_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        _config.duration(text)


def test_bad_duration_in_the_environment_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FORKLIFT_LEASE", "10x")
    with pytest.raises(forklift.ConfigError, match="FORKLIFT_LEASE='10x'"):
        _config.env("LEASE", _config.duration, 30.0)
    monkeypatch.setenv("FORKLIFT_LEASE", "5m")
    assert _config.env("LEASE", _config.duration, 30.0) == 300.0
    monkeypatch.setenv("FORKLIFT_LEASE", "")
    assert _config.env("LEASE", _config.duration, 30.0) == 30.0


# -- redact ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("postgresql://u:secret@h/db", ["postgresql://u:", "@h/db"]),
        ("postgres://u:secret@h:5432/db?sslmode=require", ["@h:5432/db?sslmode=require"]),
        ("postgresql://:secret@h/db", ["@h/db"]),
        ("could not connect to postgresql://app:secret@db.internal/x: refused", ["refused"]),
        ("password=secret host=x", ["host=x"]),
        ("host=x password=secret dbname=y", ["host=x", "dbname=y"]),
        ("host=x password = secret dbname=y", ["host=x", "dbname=y"]),
        ("PASSWORD=secret host=x", ["host=x"]),
        ("password='se cret' host=x", ["host=x"]),
        ("password='se\\'cret' host=x", ["host=x"]),
        ("postgresql://h/db?password=secret&sslmode=require", ["postgresql://h/db?"]),
    ],
)
def test_redact_hides_passwords(text: str, kept: list[str]) -> None:
    out = _db.redact(text)
    assert "secret" not in out
    assert "cret" not in out
    assert "***" in out
    for part in kept:
        assert part in out, out


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://root@127.0.0.1:5432/test",
        "host=x user=u dbname=y",
        "job 12 failed: ValueError: bad input",
        "",
    ],
)
def test_redact_leaves_text_without_passwords_alone(text: str) -> None:
    assert _db.redact(text) == text


def test_redact_handles_two_dsns_in_one_message() -> None:
    out = _db.redact("from postgresql://a:one1@h/x to postgresql://b:two2@h/y")
    assert "one1" not in out and "two2" not in out


def test_the_password_in_use_is_hidden_where_it_stands_not_inside_other_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Password `bench` turned `task=bench_job` into `task=***_job`."""
    monkeypatch.setattr(_redact, "_SECRETS", ())  # this test's passwords stay in this test
    _db.remember_secrets("postgresql://bench:bench@127.0.0.1:5432/bench")
    _db.remember_secrets("host=db user=app password=hunter22 dbname=app")
    for line in (
        "job.succeeded task=bench_job queue=bench worker=bench-1 db=bench",
        "task=hunter22_job note='hunter22 is a word here'",
    ):
        assert _db.redact(line) == line
    assert (
        _db.redact("cannot connect to postgresql://bench:bench@127.0.0.1/bench: refused")
        == "cannot connect to postgresql://bench:***@127.0.0.1/bench: refused"
    )
    assert _db.redact("host=db password=hunter22 dbname=app") == "host=db password=*** dbname=app"


def test_a_malformed_dsns_pieces_are_hidden_as_words_wherever_they_appear(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A DSN that does not parse shows its password's pieces where no pattern finds them
    (as a host name): those are hidden as whole words, never inside other words."""
    monkeypatch.setattr(_redact, "_SECRETS", ())
    _db.remember_secrets("postgresql://u:Hunter2@Tailor x@db.example.com/app")
    text = _db.redact(
        "failed to resolve host 'Tailor x@db.example.com' (Hunter2@Tailor) for Tailored_job"
    )
    assert text == "failed to resolve host '*** x@db.example.com' (***@***) for Tailored_job"


# -- timeouts ----------------------------------------------------------------------------


@pytest.mark.parametrize("lease", [1, 5, 30, 300])
def test_timeouts_for_lease_stay_below_half_the_lease(lease: float) -> None:
    # A call that could outlast half the lease would let the lease expire mid-call.
    t = _db.Timeouts.for_lease(lease)
    assert t.statement < lease / 2, t
    assert t.lock < lease / 2, t
    assert t.idle_in_transaction < lease, t
    # libpq never waits less than 2 s to connect: that floor is the one exception.
    assert t.connect < lease / 2 or t.connect == 2.0, t


@pytest.mark.parametrize("lease", [1, 5, 30, 300, 3600])
def test_timeouts_for_lease_are_positive_and_bounded(lease: float) -> None:
    t = _db.Timeouts.for_lease(lease)
    for value in (t.statement, t.lock, t.connect, t.idle_in_transaction):
        assert 0 < value <= 60
    assert t.lock <= t.statement


def test_timeouts_become_server_options_in_their_units() -> None:
    opts = _db.Timeouts(connect=2, statement=1.5, lock=0.25, idle_in_transaction=20).options()
    assert opts.split()[1::2] == [
        "statement_timeout=1500",
        "lock_timeout=250",
        "idle_in_transaction_session_timeout=20000",
        "tcp_keepalives_idle=10",
        "tcp_keepalives_interval=5",
        "tcp_keepalives_count=3",
        "tcp_user_timeout=30000",
    ]


# -- resolve_dsn -------------------------------------------------------------------------


@pytest.fixture
def no_db_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("FORKLIFT_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    return monkeypatch


def test_resolve_dsn_without_any_source_is_a_config_error(no_db_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(forklift.ConfigError, match="FORKLIFT_DATABASE_URL"):
        _db.resolve_dsn(None)


def test_resolve_dsn_empty_variables_count_as_unset(no_db_env: pytest.MonkeyPatch) -> None:
    no_db_env.setenv("FORKLIFT_DATABASE_URL", "")
    no_db_env.setenv("DATABASE_URL", "")
    with pytest.raises(forklift.ConfigError):
        _db.resolve_dsn(None)


def test_resolve_dsn_prefers_forklift_database_url(no_db_env: pytest.MonkeyPatch) -> None:
    no_db_env.setenv("DATABASE_URL", "postgresql://generic/db")
    assert _db.resolve_dsn(None) == "postgresql://generic/db"
    no_db_env.setenv("FORKLIFT_DATABASE_URL", "postgresql://forklift/db")
    assert _db.resolve_dsn(None) == "postgresql://forklift/db"


def test_resolve_dsn_explicit_wins(no_db_env: pytest.MonkeyPatch) -> None:
    no_db_env.setenv("FORKLIFT_DATABASE_URL", "postgresql://forklift/db")
    no_db_env.setenv("DATABASE_URL", "postgresql://generic/db")
    assert _db.resolve_dsn("postgresql://given/db") == "postgresql://given/db"


def test_app_without_dsn_reports_config_error_only_when_used(
    no_db_env: pytest.MonkeyPatch,
) -> None:
    app = forklift.App(schema="t_unit")  # building an app does no I/O and needs no DSN
    with pytest.raises(forklift.ConfigError):
        _ = app.dsn


@pytest.mark.parametrize("lease", [1, 3, 30, 300])
def test_connections_keep_alive_and_give_up_on_a_vanished_peer(lease: float) -> None:
    # A host that vanishes (or a network that drops everything) must not leave the
    # other side's session, and the locks of its transaction, waiting for ever: both
    # ends probe an idle connection and give up unanswered data, well past a brief
    # stall (seconds) and within a couple of leases.
    t = _db.Timeouts.for_lease(lease)
    kwargs = _db.connect_kwargs(t)
    assert kwargs["keepalives"] == 1
    gone_after = t.keepalive_idle + t.keepalive_interval * t.keepalive_count
    assert 10 <= gone_after <= max(60, 2 * lease), t
    assert 10 <= t.tcp_user <= max(60, 2 * lease), t
    assert kwargs["keepalives_idle"] == round(t.keepalive_idle)
    assert kwargs["tcp_user_timeout"] == int(t.tcp_user * 1000)
    server = dict(o.split("=") for o in t.options().split() if o != "-c")
    assert server["tcp_keepalives_idle"] == str(round(t.keepalive_idle))
    assert server["tcp_user_timeout"] == str(int(t.tcp_user * 1000))
