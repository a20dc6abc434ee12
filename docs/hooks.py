"""MkDocs hooks: the reference pages that are written from the code at every build.

`reference/cli.md` comes from the argument parser (forklift.cli.reference), so every
command, flag, environment variable, default and example is the one `--help` prints;
`reference/metrics.md` from the collectors behind a supervisor's /metrics;
`reference/schema.md` from the migrations in forklift/schema/ and the canonical schema
that tests/integration/test_migrations.py checks every migrated database against. None
of them is checked in: a build writes them afresh, so none can drift from the code.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from forklift.cli.reference import prose

ROOT = Path(__file__).resolve().parents[1]
CANONICAL = ROOT / "tests" / "integration" / "canonical_schema.txt"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated pages to the site (before its navigation is built)."""
    for path, content in pages():
        files.append(File.generated(config, path, content=content))
    return files


def pages() -> Iterator[tuple[str, str]]:
    """Each generated page: its path under docs/ and its Markdown."""
    from forklift.cli import build_parser, reference

    yield "reference/cli.md", reference.page(build_parser())
    yield "reference/metrics.md", metrics_page()
    yield "reference/schema.md", schema_page()


# -- metrics ---------------------------------------------------------------------------


def metric_families() -> list[Any]:
    """Every metric family a supervisor's /metrics serves, as its collectors make them:
    the children's summed counts (TotalsCollector), the live gauges (LiveCollector) and
    the schedules' (CronCollector), the three that supervisor/served.py registers. A
    supervisor is built as `forklift run` builds it, with no database: nothing here
    connects."""
    import forklift
    from forklift.metrics import Totals
    from forklift.scheduler.metrics import CronCollector
    from forklift.supervisor import Supervisor
    from forklift.supervisor.config import SupervisorConfig
    from forklift.supervisor.exposition import TotalsCollector
    from forklift.supervisor.probes import LiveCollector

    app = forklift.App("postgresql://docs.invalid/none", schema="forklift")
    served = Supervisor(app, SupervisorConfig(workers=1)).served()
    collectors = (
        TotalsCollector(Totals()),
        LiveCollector(served.probes),
        CronCollector(served.scheduler),
    )
    return [family for collector in collectors for family in collector.collect()]


def _series(family: Any) -> str:
    """The names a family's series go by: counters end in _total, histograms have
    _bucket, _sum and _count."""
    if family.type == "counter":
        return f"`{family.name}_total`"
    if family.type == "histogram":
        return f"`{family.name}_bucket`, `_sum`, `_count`"
    return f"`{family.name}`"


METRICS_INTRO = """\
# Metrics

`forklift run` serves these at `--metrics-addr` (default `127.0.0.1:9367`) on
`/metrics`: every worker's counts summed by its supervisor, the gauges of the queues it
serves (`--queues`) and of its workers, and its schedules'. This table is generated
from the collectors themselves at every build of this site. How they are counted, and
what the probes beside them answer, is in [Deploying](../deploying.md#observing-it).
"""


def metrics_page() -> str:
    """The metrics reference page."""
    from forklift import metrics

    rows = ["| metric | type | labels | what it counts |", "| --- | --- | --- | --- |"]
    for family in metric_families():
        labels = ", ".join(f"`{name}`" for name in getattr(family, "_labelnames", ()))
        rows.append(
            f"| {_series(family)} | {family.type} | {labels} | {prose(family.documentation)} |"
        )
    outcomes = ", ".join(f"`{o}`" for o in metrics.OUTCOMES)
    batches = ", ".join(f"`{o}`" for o in metrics.BATCH_OUTCOMES)
    notes = f"""\
## Labels

- `outcome` of `forklift_jobs_total`: {outcomes}.
- `outcome` of `forklift_batches_total`: {batches}.
- `task` is bounded, whatever producers enqueue: a job whose task the app does not
  declare is counted as `task="{metrics.UNKNOWN_TASK}"`, and past
  {metrics.MAX_TASK_LABELS} distinct task names further ones are counted as
  `task="{metrics.OTHER_TASK}"`.
- `queue` labels of the gauges are the queues this supervisor serves: queues nobody
  here serves get no series.
"""
    return "\n\n".join([METRICS_INTRO, "\n".join(rows), notes])


# -- schema ----------------------------------------------------------------------------


def header(text: str) -> list[str]:
    """A migration's header comment, without its `--` marks and the boilerplate line
    about `{schema}`: its lines, '' between paragraphs."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line[2:].strip())
    body = "\n".join(lines)
    body = re.sub(
        r"\s*\{schema\}\s+is\s+replaced\s+by\s+the\s+quoted\s+schema\s+name\s+when\s+the"
        r"\s+migration\s+is\s+applied\.",
        "",
        body,
    )
    return [line for line in body.splitlines() if line != "forklift: online"]


def paragraphs(lines: list[str]) -> str:
    """Comment lines as Markdown: paragraphs, and `- ` items as a list."""
    out: list[str] = []
    for para in "\n".join(lines).split("\n\n"):
        items = re.split(r"\n(?=- )", para.strip())
        if items[0].startswith("- "):
            out.append("\n".join(f"- {prose(item[2:])}" for item in items))
        elif len(items) > 1:
            out.append(prose(items[0]) + "\n\n" + "\n".join(f"- {prose(i[2:])}" for i in items[1:]))
        elif para.strip():
            out.append(prose(para))
    return "\n\n".join(out)


def migration_sections() -> Iterator[str]:
    """One section per migration: its number and title, then its header comment."""
    from forklift.schema import ONLINE_ROWS, migrations

    for m in migrations():
        lines = header(m.text)
        end = lines.index("") if "" in lines else len(lines)  # the first paragraph
        title = re.sub(rf"^forklift {m.version:04d}:\s*", "", " ".join(lines[:end]))
        title = title[:1].upper() + title[1:]
        rest = lines[end:]
        online = (
            f"\n\n*Online*: on a jobs table of more than {ONLINE_ROWS:,} rows its indexes "
            "are built (and dropped) `CONCURRENTLY`, outside a transaction."
            if m.online
            else ""
        )
        body = paragraphs(rest)
        yield f"### {m.version:04d} {m.name}\n\n{prose(title)}{online}\n\n{body}".rstrip()


def canonical() -> dict[str, list[str]]:
    """tests/integration/canonical_schema.txt, by kind: `table`, `column`, `index`,
    ... (a function's lines are joined to its entry)."""
    kinds: dict[str, list[str]] = {}
    last: list[str] = []
    for line in CANONICAL.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith(" ") and last:
            last[-1] += "\n" + line[4:]
            continue
        kind, _, rest = line.partition(" ")
        last = kinds.setdefault(kind, [])
        last.append(rest)
    return kinds


def _table_section(name: str, kinds: dict[str, list[str]]) -> str:
    """One table: its columns, constraints and indexes."""
    (heading,) = [t for t in kinds["table"] if t.split()[0] == name]
    options = heading[len(name) :].strip()
    rows = ["| column | type |", "| --- | --- |"]
    for column in kinds.get("column", []):
        owner, _, rest = column.partition(".")
        if owner == name:
            col, _, kind = rest.partition(" ")
            rows.append(f"| `{col}` | `{kind}` |")
    parts = [f"### {name}", f"Storage: `{options}`" if options else "", "\n".join(rows)]
    for kind, title in (("constraint", "Constraints"), ("index", "Indexes")):
        entries = [_entry(e) for e in kinds.get(kind, []) if _belongs(kind, e, name)]
        if entries:
            parts.append(f"{title}:\n\n" + "\n".join(entries))
    return "\n\n".join(p for p in parts if p)


def _belongs(kind: str, entry: str, table: str) -> bool:
    if kind == "constraint":
        return entry.startswith(f"{table}.")
    return f" ON {{schema}}.{table} " in entry


def _entry(entry: str) -> str:
    name, _, definition = entry.partition(": ")
    return f"- `{name.split('.')[-1]}`: `{definition}`"


def schema_page() -> str:
    """The schema reference page: the migrations, then what they build."""
    kinds = canonical()
    tables = [t.split()[0] for t in kinds["table"]]
    enums = "\n".join(f"- `{e}`" for e in kinds.get("enum", []))
    triggers = "\n".join(_entry(t) for t in kinds.get("trigger", []))
    functions = "\n\n".join(_function(f) for f in kinds.get("function", []))
    return (
        "\n\n".join(
            [
                SCHEMA_INTRO,
                "## Migrations",
                *migration_sections(),
                CANONICAL_INTRO,
                f"### Types\n\n{enums}",
                *(_table_section(t, kinds) for t in tables),
                f"### Triggers\n\n{triggers}",
                f"### Functions\n\n{functions}",
                _others(kinds),
            ]
        ).rstrip()
        + "\n"
    )


def _function(entry: str) -> str:
    signature, _, body = entry.partition(":\n")
    return f"`{signature}`\n\n```sql\n{body.rstrip()}\n```"


def _others(kinds: dict[str, list[str]]) -> str:
    """Whatever kind of object the canonical schema lists that the sections above do not
    show, so a new kind is never left out silently."""
    shown = {"enum", "table", "column", "constraint", "index", "trigger", "function"}
    rest = [f"- {kind} `{entry}`" for kind in sorted(set(kinds) - shown) for entry in kinds[kind]]
    return "### Other objects\n\n" + "\n".join(rest) if rest else ""


SCHEMA_INTRO = """\
# Schema and migrations

forklift keeps all it stores in one PostgreSQL schema (`--schema`, `FORKLIFT_SCHEMA`,
default `forklift`). `forklift migrate` applies the migrations below once each, in
order, under an advisory lock (replicas that start together do not race), and records
each in `schema_migrations` with its checksum; running it again applies nothing new.
This page is generated at every build of the site from the migrations shipped in
`forklift/schema/` and the schema they build; upgrading is described in
[Upgrading](../upgrading.md). `{schema}` below stands for the schema's name.
"""

CANONICAL_INTRO = """\
## The schema the migrations build

What migrating an empty schema produces, as `tests/integration/canonical_schema.txt`
records it: the migration tests compare every freshly migrated schema with it, so it is
the schema as it is.\
"""
