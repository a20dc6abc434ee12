"""The web framework examples (examples/django_app, fastapi_app.py, sqlalchemy_app.py) on a
real database: a request's job commits with the request's writes, a failing request
enqueues nothing, a real supervisor runs the jobs, and their effects and results show.

Each example's producer side runs in this process (Django's test Client, FastAPI's app
over httpx's ASGI transport with its lifespan, a SQLAlchemy Session); its worker side is
`forklift run MODULE:app`, as the examples' docstrings say to run it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from examples import fastapi_app, sqlalchemy_app
from forklift.testing import WaitTimedOut, wait_for
from tests.acceptance.conftest import scalar


@pytest.fixture
def example_env(dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's environment pointed at the test's database and schema, as the
    examples read them (the forklift Apps of the already imported ones are told too)."""
    monkeypatch.setenv("FORKLIFT_DATABASE_URL", dsn)
    monkeypatch.setenv("FORKLIFT_SCHEMA", schema)
    monkeypatch.setattr(fastapi_app.app, "schema", schema)
    monkeypatch.setattr(sqlalchemy_app.app, "schema", schema)


def jobs(db: psycopg.Connection[Any], schema: str) -> dict[int, tuple[str, dict[str, Any]]]:
    """{job id: (task, args)} of every job in the schema."""
    rows = db.execute(f"SELECT id, task, args FROM {schema}.jobs").fetchall()
    return {job_id: (task, args) for job_id, task, args in rows}


# -- Django ------------------------------------------------------------------------------


@pytest.fixture
def django_project(
    example_env: None, schema: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    """examples.django_app set up in this process against the test's schema, its tables
    migrated; its connections and forklift App closed afterwards. Django reads its
    settings once per process: one test of a run may use it."""
    import django
    from django.conf import settings
    from django.core.management import call_command

    if "examples.django_app.settings" in sys.modules:
        pytest.fail("Django was set up in this process already, for another schema")
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
    django.setup()
    assert schema == settings.FORKLIFT_SCHEMA
    from django.db import connections

    from examples.django_app.orders import tasks

    call_command("migrate", verbosity=0)
    yield tasks
    connections.close_all()
    tasks.app.close()


def test_django_enqueues_in_the_requests_transaction(
    django_project: Any, db: psycopg.Connection[Any], schema: str, forklift_cli: Any
) -> None:
    from django.test import Client

    from examples.django_app.orders.models import Stock

    Stock.objects.create(item="apple", available=3)
    client = Client()

    def post(path: str, quantity: int) -> tuple[int, dict[str, Any]]:
        body = json.dumps({"item": "apple", "quantity": quantity})
        resp = client.post(path, body, content_type="application/json")
        return resp.status_code, resp.json()

    status, order = post("/orders", 2)
    assert status == 201, order
    assert jobs(db, schema) == {order["job_id"]: ("fulfil_order", {"order_id": order["id"]})}
    # Out of stock after the job was enqueued: the order and its job roll back together.
    status, refused = post("/orders", 2)
    assert (status, refused) == (409, {"error": "not enough 'apple' left for 2"})
    assert scalar(db, f"SELECT count(*) FROM {schema}.orders_order") == 1
    assert len(jobs(db, schema)) == 1
    assert scalar(db, f"SELECT available FROM {schema}.orders_stock") == 1
    # on_commit: enqueued after the commit, on forklift's own connection.
    status, later = post("/orders/after-commit", 1)
    assert status == 201, later
    assert ("fulfil_order", {"order_id": later["id"]}) in jobs(db, schema).values()

    sup = forklift_cli("run", "examples.django_app.worker:app", "--workers", "1")
    shown = [f"/orders/{order['id']}", f"/orders/{later['id']}"]
    wait_for(
        lambda: all(client.get(url).json()["status"] == "fulfilled" for url in shown),
        timeout=20,
        what="both orders fulfilled",
    )
    assert django_project.app.result(order["job_id"], timeout=5) == {
        "order_id": order["id"],
        "fulfilled": True,
        "item": "apple",
        "quantity": 2,
    }
    sup.stop_cleanly()


# -- FastAPI -----------------------------------------------------------------------------


async def until(condition: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    """wait_for on the event loop: poll `condition` without blocking the loop."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise WaitTimedOut(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


async def fastapi_requests(
    db: psycopg.Connection[Any], schema: str, forklift_cli: Any, waits: list[float]
) -> None:
    """The FastAPI test's requests, inside the app's lifespan. `waits`: the timeout of
    each App.result call the app has made, as they are made."""
    api = fastapi_app.api
    transport = httpx.ASGITransport(app=api)
    async with (
        api.router.lifespan_context(api),
        httpx.AsyncClient(transport=transport, base_url="http://example") as client,
    ):
        docs = [{"title": "one", "text": "a b c"}, {"title": "two", "text": "d e"}]
        resp = await client.post("/documents", json=docs)
        assert resp.status_code == 201, resp.text
        created = resp.json()
        assert jobs(db, schema) == {
            c["job_id"]: ("count_words", {"document_id": c["id"]}) for c in created
        }
        # "one" exists: the whole request rolls back, "three" and its job too.
        resp = await client.post("/documents", json=[{"title": "three", "text": "x"}, docs[0]])
        assert resp.status_code == 409, resp.text
        assert scalar(db, f"SELECT count(*) FROM {schema}.documents") == 2
        assert len(jobs(db, schema)) == 2

        first = created[0]["id"]
        assert (await client.get(f"/documents/{first}")).status_code == 202  # no worker yet
        # A GET awaiting the result does not hold up the event loop: a POST is served
        # meanwhile, and the GET answers once a worker has run the job.
        waiting = asyncio.create_task(client.get(f"/documents/{first}?wait=20"))
        await until(lambda: 20 in waits, "the GET waiting for the job's result")
        resp = await client.post("/documents", json=[{"title": "four", "text": "e f g h"}])
        assert resp.status_code == 201 and not waiting.done()
        sup = forklift_cli("run", "examples.fastapi_app:app", "--workers", "1")
        resp = await waiting
        assert resp.status_code == 200, resp.text
        assert resp.json() == {"id": first, "title": "one", "words": 3}
        wait_for(
            lambda: scalar(db, f"SELECT count(*) FROM {schema}.documents WHERE words IS NULL") == 0,
            timeout=20,
            what="every document counted",
        )
        resp = await client.get(f"/documents/{created[1]['id']}")
        assert resp.json() == {"id": created[1]["id"], "title": "two", "words": 2}
    sup.stop_cleanly()


def test_fastapi_enqueues_async_in_the_requests_transaction(
    example_env: None,
    db: psycopg.Connection[Any],
    schema: str,
    forklift_cli: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[float] = []
    result = fastapi_app.app.result

    def noted(job_id: int, timeout: float = 30.0) -> Any:
        waits.append(timeout)
        return result(job_id, timeout)

    monkeypatch.setattr(fastapi_app.app, "result", noted)
    asyncio.run(fastapi_requests(db, schema, forklift_cli, waits))


# -- SQLAlchemy --------------------------------------------------------------------------


def signups(db: psycopg.Connection[Any], schema: str) -> list[str]:
    return [r[0] for r in db.execute(f"SELECT email FROM {schema}.signups ORDER BY id")]


def test_sqlalchemy_enqueues_in_the_sessions_transaction(
    example_env: None, dsn: str, db: psycopg.Connection[Any], schema: str, forklift_cli: Any
) -> None:
    app = sqlalchemy_app.app
    engine = sqlalchemy_app.make_engine(dsn, schema)
    try:
        sqlalchemy_app.Base.metadata.create_all(engine)
        with Session(engine) as session, session.begin():
            added = sqlalchemy_app.sign_up(session, ["ada@example.com", "bob@example.com"])
            job_ids = {s.job_id: s.id for s in added if s.job_id is not None}
            assert jobs(db, schema) == {}  # not committed yet
        assert len(job_ids) == 2
        assert jobs(db, schema) == {j: ("welcome", {"signup_id": s}) for j, s in job_ids.items()}
        # Rolled back: the job was in the Session's transaction, and goes with it.
        with Session(engine) as session:
            sqlalchemy_app.sign_up(session, ["cy@example.com"])
            in_session = session.execute(text(f"SELECT count(*) FROM {schema}.jobs")).scalar()
            assert in_session == 3
            session.rollback()
        # An error does the same: ada is signed up, so dee's row and job go too.
        with pytest.raises(IntegrityError), Session(engine) as session, session.begin():
            sqlalchemy_app.sign_up(session, ["dee@example.com", "ada@example.com"])
        assert signups(db, schema) == ["ada@example.com", "bob@example.com"]
        assert set(jobs(db, schema)) == set(job_ids)

        sup = forklift_cli("run", "examples.sqlalchemy_app:app", "--workers", "1")
        for job_id, signup_id in job_ids.items():
            assert app.result(job_id, timeout=20) == {"signup_id": signup_id, "welcomed": True}
        welcomed = f"SELECT count(*) FROM {schema}.signups WHERE welcomed_at IS NOT NULL"
        assert scalar(db, welcomed) == 2
        sup.stop_cleanly()
    finally:
        engine.dispose()
        app.close()
