"""A new job's columns are named once in Python (store/_inserts.py) and once in SQL (the
store's fragments.sql), in one order; every insert of a job is built from both."""

from __future__ import annotations

import re
from dataclasses import fields
from importlib import resources

from forklift import _sql
from forklift.store import NewJob, _inserts

INSERT_JOBS = r"INSERT INTO \{schema\}\.jobs"


def fragment(name: str) -> str:
    shared = resources.files("forklift.store").joinpath(_sql.FRAGMENTS).read_text("utf-8")
    return _sql.parse(f"-- name: probe\n{{{name}}}\n", shared)["probe"]


def test_the_columns_and_the_parameters_are_those_of_the_job_in_one_order() -> None:
    columns = [c.strip() for c in fragment("_job_columns").split(",")]
    assert tuple(columns) == _inserts.COLUMNS
    arrays = re.findall(r"%\((\w+)\)s::(\w+)\[\]", fragment("_job_arrays"))
    assert tuple(name for name, _ in arrays) == _inserts.FIELDS
    assert re.findall(r"%\((\w+)\)s::(\w+)", fragment("_job_values")) == arrays
    assert set(_inserts.FIELDS) <= {f.name for f in fields(NewJob)}
    unique = re.findall(r"%\((\w+)\)s::(\w+)\[\]", fragment("_unique_arrays"))
    assert tuple(name for name, _ in arrays + unique) == _inserts.UNIQUE_FIELDS
    assert re.findall(r"%\((\w+)\)s::(\w+)", fragment("_unique_values")) == unique
    assert [c.strip() for c in fragment("_unique_fields").split(",")] == [n for n, _ in unique]
    assert set(_inserts.UNIQUE_FIELDS) <= {f.name for f in fields(NewJob)}


def test_every_insert_of_a_job_takes_the_columns_from_the_fragments() -> None:
    """No statement that inserts a job names its columns itself."""
    inserts = {
        ("forklift.store", "queries.sql"): {
            "job_insert",
            "job_insert_quiet",
            "job_insert_many",
            "job_insert_unique",
            "job_insert_many_unique",
        },
        ("forklift.store", "batches.sql"): {"batch_finish"},
        ("forklift.store", "workflows.sql"): {"workflow_grow"},
        ("forklift.scheduler", "queries.sql"): {"schedule_fire"},
    }
    for (package, filename), names in inserts.items():
        text = resources.files(package).joinpath(filename).read_text("utf-8")
        parts = re.split(r"(?m)^-- name: (\w+)\s*$", text)  # as written, fragments unfilled
        queries = dict(zip(parts[1::2], parts[2::2], strict=True))
        writers = {n for n, sql in queries.items() if re.search(INSERT_JOBS + r"\b", sql)}
        assert writers == names, (filename, writers)
        for name in names:
            assert re.search(INSERT_JOBS + r" \((id, )?\{_job_columns\}", queries[name]), name
