"""An async producer on FastAPI: documents and their jobs in the request's transaction.

`POST /documents` with `[{"title": "a", "text": "..."}, ...]` inserts each document and
enqueues the job that counts its words, with `enqueue_async(conn=...)` on the request's
own psycopg AsyncConnection, in one transaction: every row and every job commit
together, or none does (a title that exists already: 409, and nothing is added). A
worker runs `count_words`, an async handler that stores the count in the transaction
that completes its job. `GET /documents/<id>?wait=5` answers with the count, awaiting
the job's result for up to `wait` seconds without blocking the event loop.

The App's lifecycle follows FastAPI's lifespan: forklift's schema and the example's
table are made before the first request, the connection pool opened; after the last,
the pools close (the producer's too). Everything lives in the app's schema
(FORKLIFT_SCHEMA). With no FORKLIFT_DATABASE_URL, forklift uses the project's development
database under ./.forklift (the `embedded` extra). From the repository root, with any
ASGI server (uvicorn here: `pip install uvicorn`):

    export FORKLIFT_DATABASE_URL=postgresql://localhost/mydb FORKLIFT_SCHEMA=docs
    uvicorn examples.fastapi_app:api                          # terminal 1: migrates, serves
    .venv/bin/forklift run examples.fastapi_app:app           # terminal 2: the workers
    curl -si -H 'Content-Type: application/json' \\
        -d '[{"title": "hello", "text": "a few words"}]' localhost:8000/documents
    curl -si 'localhost:8000/documents/1?wait=5'
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Annotated, Any

import psycopg
from fastapi import Body, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

import forklift

app = forklift.App()

# The app's table, in the app's schema (checked by forklift: safe to quote in).
# documents.job_id is NULL only inside the transaction that inserts the row.
TABLE = """
CREATE TABLE IF NOT EXISTS "{schema}".documents (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    title  text NOT NULL UNIQUE,
    body   text NOT NULL,
    job_id bigint UNIQUE,
    words  integer
)
"""
INSERT = 'INSERT INTO "{schema}".documents (title, body) VALUES (%s, %s) RETURNING id'
SET_JOB = 'UPDATE "{schema}".documents SET job_id = %s WHERE id = %s'
GET = 'SELECT title, job_id, words FROM "{schema}".documents WHERE id = %s'
BODY = 'SELECT body FROM "{schema}".documents WHERE id = %s'
SET_WORDS = 'UPDATE "{schema}".documents SET words = %s WHERE id = %s'

MAX_WAIT = 30.0  # seconds a GET may wait for a job's result
# forklift has no async result API: App.result blocks, so GETs wait on threads of their
# own, this many at once (more wait their turn). Not on the loop's default executor
# (asyncio.to_thread), which enqueue_async() also uses: a crowd of waiting GETs must not
# hold up the POSTs' enqueues.
WAITERS = 16


@app.task(max_attempts=3, timeout=30.0)
async def count_words(ctx: forklift.AsyncJobContext, *, document_id: int) -> dict[str, int]:
    """Count the document's words and store the count in the transaction that completes
    the job: a retry after a crash stores it once. The dict is the job's result."""
    async with ctx.transaction() as conn:
        cur = await conn.execute(BODY.format(schema=app.schema), (document_id,))
        row = await cur.fetchone()
        if row is None:
            raise forklift.Fail(f"no document {document_id}")  # no retry would find one
        words = len(row[0].split())
        await conn.execute(SET_WORDS.format(schema=app.schema), (words, document_id))
    return {"document_id": document_id, "words": words}


def prepare() -> str:
    """forklift's schema (a no-op when current), then the DSN for the web's own pool.
    Blocking: the lifespan runs it in a thread."""
    app.migrate()
    return app.dsn


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    """Before the first request: the schema, the table, the pool and the result waiters;
    after the last: all closed, forklift's producer pool too."""
    dsn = await asyncio.to_thread(prepare)
    pool = AsyncConnectionPool(dsn, min_size=1, max_size=8, timeout=5.0, open=False)
    await pool.open(wait=True, timeout=10.0)
    async with pool.connection() as conn:
        await conn.execute(TABLE.format(schema=app.schema))
    api.state.pool = pool
    api.state.waiters = ThreadPoolExecutor(WAITERS, thread_name_prefix="result-wait")
    try:
        yield
    finally:
        api.state.waiters.shutdown()
        await pool.close()
        await asyncio.to_thread(app.close)


api = FastAPI(lifespan=lifespan)


def request_pool(request: Request) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
    """The web's connection pool, opened by the lifespan."""
    found: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = request.app.state.pool
    return found


Pool = Annotated[AsyncConnectionPool[psycopg.AsyncConnection[Any]], Depends(request_pool)]


class Document(BaseModel):
    title: str = Field(min_length=1, max_length=200)
    text: str = Field(max_length=100_000)


@api.post("/documents", status_code=201)
async def create_documents(
    documents: Annotated[list[Document], Body(min_length=1, max_length=100)], pool: Pool
) -> list[dict[str, int]]:
    """Every document and its job, committed together, or (any error) none of them."""
    created = []
    try:
        async with pool.connection() as conn, conn.transaction():
            for doc in documents:
                cur = await conn.execute(INSERT.format(schema=app.schema), (doc.title, doc.text))
                row = await cur.fetchone()
                assert row is not None  # INSERT ... RETURNING: one row
                job_id = await count_words.enqueue_async(conn=conn, document_id=row[0])
                await conn.execute(SET_JOB.format(schema=app.schema), (job_id, row[0]))
                created.append({"id": row[0], "job_id": job_id})
    except psycopg.errors.UniqueViolation:
        # The transaction rolled back: the documents before this one, and their jobs.
        raise HTTPException(409, "a document with one of these titles exists") from None
    return created


@api.get("/documents/{document_id}")
async def show_document(
    document_id: int,
    request: Request,
    pool: Pool,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT)] = 0.0,
) -> JSONResponse:
    """The document's word count: from its row once stored, else the job's result,
    awaited for `wait` seconds at most (202 while it is not there yet)."""
    async with pool.connection() as conn:  # given back before any waiting
        cur = await conn.execute(GET.format(schema=app.schema), (document_id,))
        row = await cur.fetchone()
    if row is None:
        raise HTTPException(404, f"no document {document_id}")
    title, job_id, words = row
    if words is None:
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(request.app.state.waiters, app.result, job_id, wait)
        except TimeoutError:
            return JSONResponse({"id": document_id, "state": "pending"}, 202)
        except forklift.JobFailed:  # its last error is the worker's log's, not the client's
            return JSONResponse({"id": document_id, "state": "failed"}, 500)
        except forklift.JobCancelled:
            return JSONResponse({"id": document_id, "state": "cancelled"}, 500)
        words = result["words"]
    return JSONResponse({"id": document_id, "title": title, "words": words})
