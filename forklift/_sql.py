"""Load named queries from `.sql` files once, with the schema name filled in."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from forklift.errors import ConfigError

# 58 characters at most: the notification channels, "<schema>_jobs", "<schema>_ctl" and
# "<schema>_done", must fit the 63 bytes of a PostgreSQL identifier.
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,57}$")
_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_FRAGMENT = re.compile(r"\{_\w+\}")
FRAGMENTS = "fragments.sql"  # a package's shared fragments (load)
STORE = "forklift.store"  # whose fragments every package's queries have (load)


def check_schema_name(schema: str) -> str:
    """Return `schema` if it is a plain lower-case identifier, else raise ConfigError."""
    if not _IDENTIFIER.fullmatch(schema) or schema.startswith("pg_"):
        raise ConfigError(
            f"schema name {schema!r} must be a lower-case identifier "
            "(letters, digits, underscore; at most 58 characters; not starting with pg_)"
        )
    return schema


def channel_name(schema: str) -> str:
    """The LISTEN/NOTIFY channel on which workers of `schema` hear of ready jobs."""
    return f"{check_schema_name(schema)}_jobs"


def control_channel_name(schema: str) -> str:
    """The channel on which workers of `schema` hear operators' orders (`cancel <id> <attempt>`).

    Apart from the job channel, whose every payload is a queue name: a worker that only
    wakes on its queues never mistakes an order for one.
    """
    return f"{check_schema_name(schema)}_ctl"


def done_channel_name(schema: str) -> str:
    """The channel on which waiters hear that a job (`j<id>`) or a batch (`b<id>`) ended:
    only a hint, re-read from the tables (app.result(), Batch.wait())."""
    return f"{check_schema_name(schema)}_done"


def render(text: str, schema: str) -> str:
    """Fill the placeholders of a query or migration.

    `{schema}` becomes the quoted schema name; `{channel}` the notification channel,
    `{control_channel}` the operators' one and `{done_channel}` the waiters', plain
    lower-case identifiers, so each serves both `LISTEN {channel}` and
    `pg_notify('{channel}', ...)`.
    """
    return (
        text.replace("{schema}", f'"{check_schema_name(schema)}"')
        .replace("{channel}", channel_name(schema))
        .replace("{control_channel}", control_channel_name(schema))
        .replace("{done_channel}", done_channel_name(schema))
    )


def parse(text: str, shared: str = "") -> dict[str, str]:
    """Split a file of `-- name: x` sections into {name: sql}.

    A section named with a leading underscore (`-- name: _part`) is a fragment, not a
    query: every `{_part}` in the file's queries (and in its other fragments) becomes its
    text, and it is not returned. The fragments of `shared` (the text of another such
    file) are the file's too.
    """
    sections = _sections(text, shared)
    return {
        name: _filled(name, sql, sections)
        for name, sql in sections.items()
        if not name.startswith("_")
    }


def parse_fragments(text: str, shared: str = "") -> dict[str, str]:
    """The fragments of `text` (and of `shared`), each with the fragments it uses filled
    in: a part of a statement, to run or test on its own."""
    sections = _sections(text, shared)
    return {
        name: _filled(name, sql, sections) for name, sql in sections.items() if name.startswith("_")
    }


def _sections(text: str, shared: str) -> dict[str, str]:
    if shared:
        text = f"{shared}\n{text}"
    parts = _HEADER.split(text)
    sections: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in sections:
            raise ValueError(f"query {name!r} is defined twice")
        lines = [line for line in body.strip().splitlines() if not line.lstrip().startswith("--")]
        sections[name] = "\n".join(lines).strip().rstrip(";")
    return sections


def _filled(name: str, sql: str, sections: dict[str, str], within: tuple[str, ...] = ()) -> str:
    """`sql` (of section `name`) with each `{_part}` replaced by that fragment's text,
    itself filled; `within`: the fragments being filled around it (one that uses itself,
    however indirectly, is an error)."""

    def fill(match: re.Match[str]) -> str:
        part = match[0][1:-1]
        if part not in sections:
            raise ValueError(f"query {name!r} uses {match[0]}, which the file does not define")
        if part in within:
            raise ValueError(f"fragment {part!r} uses itself")
        return _filled(name, sections[part], sections, (*within, part))

    return _FRAGMENT.sub(fill, sql)


def _read(package: str, filename: str) -> tuple[str, str]:
    """The text of `package/filename`, and of the `fragments.sql` of the store (the jobs
    table's, which any package's queries may insert into) and of the package, where it has
    one."""
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    return text, "\n".join(_fragments(p) for p in dict.fromkeys((STORE, package)))


def _fragments(package: str) -> str:
    shared = resources.files(package).joinpath(FRAGMENTS)
    return shared.read_text(encoding="utf-8") if shared.is_file() else ""


@cache
def load(package: str, filename: str, schema: str) -> dict[str, str]:
    """The named queries of `package/filename`, rendered for `schema` (cached), with the
    shared fragments (_read) beside the file's own."""
    return {name: render(sql, schema) for name, sql in parse(*_read(package, filename)).items()}


def load_fragments(package: str, filename: str, schema: str) -> dict[str, str]:
    """The fragments `load` fills the queries of `package/filename` with, rendered for
    `schema`: each part of a statement on its own (the tests run them alone)."""
    return {
        name: render(sql, schema)
        for name, sql in parse_fragments(*_read(package, filename)).items()
    }
