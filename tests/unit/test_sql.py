"""Named-query files: parsing, schema-name checks, and the store's queries rendered for a schema."""

from __future__ import annotations

import re
from importlib import resources

import pytest

import forklift
from forklift import _sql

QUERIES = """\
-- A file header, before any query: ignored.
-- {schema} is replaced when loaded.

-- name: job_first
-- The first query.
SELECT 1
FROM {schema}.jobs;

-- name: job_second
-- The second query, with a description
-- that runs over two lines.
UPDATE {schema}.jobs SET n = n + 1
WHERE id = %(id)s::bigint
RETURNING id;
-- a trailing comment
-- name: job_third
SELECT 3
"""


def test_parse_splits_named_sections() -> None:
    assert _sql.parse(QUERIES) == {
        "job_first": "SELECT 1\nFROM {schema}.jobs",
        "job_second": "UPDATE {schema}.jobs SET n = n + 1\nWHERE id = %(id)s::bigint\nRETURNING id",
        "job_third": "SELECT 3",
    }


def test_parse_drops_comment_lines() -> None:
    for name, sql in _sql.parse(QUERIES).items():
        assert not any(line.startswith("--") for line in sql.splitlines()), name
        assert not sql.endswith(";"), name


def test_parse_without_headers_is_empty() -> None:
    assert _sql.parse("-- just a comment\nSELECT 1;\n") == {}
    assert _sql.parse("") == {}


def test_a_fragment_fills_its_placeholders_and_is_no_query() -> None:
    text = (
        "-- name: _mine\n-- the shared part\nSELECT id FROM t WHERE owner = %(o)s;\n"
        "-- name: job_a\nWITH m AS ({_mine}) SELECT 1 FROM m;\n"
        "-- name: job_b\nSELECT 2 WHERE EXISTS ({_mine});\n"
    )
    assert _sql.parse(text) == {
        "job_a": "WITH m AS (SELECT id FROM t WHERE owner = %(o)s) SELECT 1 FROM m",
        "job_b": "SELECT 2 WHERE EXISTS (SELECT id FROM t WHERE owner = %(o)s)",
    }


def test_a_fragment_the_file_lacks_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"\{_mine\}"):
        _sql.parse("-- name: job_a\nWITH m AS ({_mine}) SELECT 1 FROM m;\n")


def test_parse_header_needs_the_exact_form() -> None:
    # "-- name:" must start the line; a mention inside a description is not a header.
    text = "-- name: real\n-- see -- name: fake\nSELECT 1;\n"
    assert _sql.parse(text) == {"real": "SELECT 1"}


@pytest.mark.parametrize(
    "name", ["forklift", "t_abc1", "_private", "a", "jobs2", "a" * 58, "select"]
)
def test_schema_name_accepted(name: str) -> None:
    assert _sql.check_schema_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "Forklift",
        "FORKLIFT",
        "a-b",
        "a;drop",
        "a; DROP SCHEMA public CASCADE; --",
        'a"b',
        "a b",
        "a.b",
        "",
        " ",
        "1abc",
        "é",
        "a" * 59,  # "<schema>_jobs" would pass the 63-byte identifier limit
        "a" * 64,
        "a" * 200,
        "forklift\n",
        "\nforklift",
        "forklift\x00",
    ],
)
def test_schema_name_refused(name: str) -> None:
    with pytest.raises(forklift.ConfigError):
        _sql.check_schema_name(name)


def test_render_quotes_the_schema() -> None:
    assert _sql.render("SELECT * FROM {schema}.jobs", "t_x") == 'SELECT * FROM "t_x".jobs'


def test_render_refuses_a_bad_schema() -> None:
    with pytest.raises(forklift.ConfigError):
        _sql.render("SELECT * FROM {schema}.jobs", "x;drop")


def _names_used_by_the_store() -> set[str]:
    source = resources.files("forklift.store").joinpath("__init__.py").read_text("utf-8")
    return set(re.findall(r"""self\.q\[["'](\w+)["']\]""", source))


def test_store_queries_load_for_the_schema() -> None:
    used = _names_used_by_the_store()
    assert len(used) >= 10, used  # the grep itself works
    queries = {
        **_sql.load("forklift.store", "queries.sql", "forklift"),
        **_sql.load("forklift.store", "fair.sql", "forklift"),
    }
    assert used <= set(queries), sorted(used - set(queries))
    # A statement that reads or writes no table names no schema (a session setting).
    schemaless = {"effect_limits", "effect_limits_end", "quiet", "job_clock"}
    for name, sql in queries.items():
        assert sql, name
        assert "{schema}" not in sql, name
        if name not in schemaless:  # the schema, or one of its channels
            assert '"forklift".' in sql or "forklift_jobs" in sql or "forklift_ctl" in sql, name
        assert not re.search(r"(?m)^--", sql), name
        assert not sql.rstrip().endswith(";"), name


def test_store_query_names_are_unique_and_noun_first() -> None:
    store = resources.files("forklift.store")
    text = store.joinpath("queries.sql").read_text("utf-8")
    shared = store.joinpath(_sql.FRAGMENTS).read_text("utf-8")
    headers = re.findall(r"(?m)^-- name: (\w+)\s*$", text)
    assert len(headers) == len(set(headers)), headers
    fragments = {h for h in headers if h.startswith("_")}  # filled in, not queries
    assert set(headers) - fragments == set(_sql.parse(text, shared))


def test_a_packages_shared_fragments_fill_every_file_of_it() -> None:
    shared = "-- name: _part\nx = 1\n"
    assert _sql.parse("-- name: q\nSELECT 1 WHERE {_part};\n", shared) == {
        "q": "SELECT 1 WHERE x = 1"
    }
    with pytest.raises(ValueError, match="does not define"):
        _sql.parse("-- name: q\nSELECT {_part};\n")


def test_load_is_per_schema() -> None:
    a = _sql.load("forklift.store", "queries.sql", "t_one")
    b = _sql.load("forklift.store", "queries.sql", "t_two")
    assert a.keys() == b.keys()
    for name in a:
        renamed = a[name].replace('"t_one"', '"t_two"').replace("t_one_jobs", "t_two_jobs")
        renamed = renamed.replace("t_one_ctl", "t_two_ctl").replace("t_one_done", "t_two_done")
        assert renamed == b[name]
        assert '"t_two"' not in a[name]


def test_render_fills_the_channel_for_listen_and_notify() -> None:
    assert _sql.render("LISTEN {channel}; SELECT pg_notify('{channel}', 'q')", "t_x") == (
        "LISTEN t_x_jobs; SELECT pg_notify('t_x_jobs', 'q')"
    )
    assert len(_sql.channel_name("a" * 58)) == 63


def test_render_fills_the_control_channel_apart_from_the_job_channel() -> None:
    assert _sql.render("LISTEN {control_channel}; LISTEN {channel}", "t_x") == (
        "LISTEN t_x_ctl; LISTEN t_x_jobs"
    )
    assert len(_sql.control_channel_name("a" * 58)) == 62


def test_a_fragment_may_use_fragments_defined_before_or_after_it() -> None:
    text = (
        "-- name: _outer\nSELECT {_inner} FROM t\n"
        "-- name: job_a\nWITH o AS ({_outer}) SELECT 1 FROM o;\n"
        "-- name: _inner\nid, {_last}\n"
        "-- name: _last\nname\n"
    )
    assert _sql.parse(text) == {"job_a": "WITH o AS (SELECT id, name FROM t) SELECT 1 FROM o"}
    assert _sql.parse_fragments(text) == {
        "_outer": "SELECT id, name FROM t",
        "_inner": "id, name",
        "_last": "name",
    }


def test_a_fragment_that_uses_itself_is_an_error() -> None:
    with pytest.raises(ValueError, match="uses itself"):
        _sql.parse("-- name: _a\nx {_b}\n-- name: _b\ny {_a}\n-- name: q\nSELECT {_a};\n")
