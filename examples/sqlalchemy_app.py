"""Enqueue in a SQLAlchemy 2 Session's transaction: the rows and their jobs commit together.

`sign_up(session, emails)` adds a Signup row per address and enqueues the job that
welcomes it, on the psycopg connection under the Session's transaction
(`session.connection().connection.driver_connection`). Commit the Session and the rows
and the jobs are committed, in one transaction; roll it back (or let an error do it: an
address already signed up) and none of them is. A worker runs `welcome`, which marks the
signup welcomed in the transaction that completes its job.

Everything lives in the app's schema (FORKLIFT_SCHEMA). With no FORKLIFT_DATABASE_URL,
forklift uses the project's development database under ./.forklift (the `embedded`
extra). From the repository root:

    export FORKLIFT_DATABASE_URL=postgresql://localhost/mydb FORKLIFT_SCHEMA=signups
    .venv/bin/forklift run examples.sqlalchemy_app:app           # terminal 1: the workers
    .venv/bin/python -m examples.sqlalchemy_app ada@example.com bob@example.com
    .venv/bin/python -m examples.sqlalchemy_app cy@example.com ada@example.com   # refused:
    #     ada is signed up already, so cy's row and job roll back with it
"""

from __future__ import annotations

import functools
import sys
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy import BigInteger, DateTime, String, create_engine
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import forklift

app = forklift.App()


class Base(DeclarativeBase):
    pass


class Signup(Base):
    """An address signed up; welcomed_at is set by its job, `job_id`."""

    __tablename__ = "signups"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    job_id: Mapped[int | None] = mapped_column(BigInteger, unique=True)
    welcomed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


def make_engine(dsn: str, schema: str) -> Engine:
    """An engine on `dsn` (a libpq URL or key=value string) whose tables are in `schema`.
    Your project has its own engine: what forklift needs is the psycopg (3) driver under
    it, `postgresql+psycopg://...`."""
    connect = functools.partial(psycopg.connect, dsn, options=f"-c search_path={schema}")
    return create_engine("postgresql+psycopg://", creator=connect)


def driver_connection(session: Session) -> psycopg.Connection[Any]:
    """The psycopg connection under the Session's transaction (begun if it was not):
    what forklift inserts on it commits, or rolls back, with the Session."""
    conn = session.connection().connection.driver_connection
    if not isinstance(conn, psycopg.Connection):
        raise TypeError(
            "forklift enqueues on a psycopg 3 connection: make the engine with "
            f"postgresql+psycopg://, not a {type(conn).__module__} driver"
        )
    return conn


def sign_up(session: Session, emails: list[str]) -> list[Signup]:
    """A signup and its welcome job per address, in the Session's transaction: nothing
    is committed here, and the caller's rollback takes the jobs back too."""
    signups = []
    for email in emails:
        signup = Signup(email=email)
        session.add(signup)
        session.flush()  # its id, from an INSERT in the Session's transaction
        signup.job_id = welcome.enqueue(conn=driver_connection(session), signup_id=signup.id)
        signups.append(signup)
    return signups


# The worker's connection is forklift's: name the schema.
WELCOME = """
UPDATE "{schema}".signups SET welcomed_at = now()
WHERE id = %s AND welcomed_at IS NULL
RETURNING email
"""


@app.task(max_attempts=3, timeout=30.0)
def welcome(ctx: forklift.JobContext, *, signup_id: int) -> dict[str, Any]:
    """Mark the signup welcomed, committed with the job's completion: once, whatever the
    retries. SQL on ctx's connection, not the Session: a Session cannot be bound to a
    connection that SQLAlchemy did not open and whose transaction it does not own."""
    with ctx.transaction() as conn:
        row = conn.execute(WELCOME.format(schema=app.schema), (signup_id,)).fetchone()
    return {"signup_id": signup_id, "welcomed": row is not None}


def main(emails: list[str]) -> None:
    app.migrate()  # forklift's tables (a no-op when they are current), then the app's
    engine = make_engine(app.dsn, app.schema)
    try:
        Base.metadata.create_all(engine)
        with Session(engine) as session, session.begin():  # commits at the end, or not
            for signup in sign_up(session, emails):
                print(f"{signup.email}: signup {signup.id}, job {signup.job_id}")
    except IntegrityError:
        sys.exit("an address is signed up already: nothing was added, no job enqueued")
    finally:
        engine.dispose()
        app.close()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m examples.sqlalchemy_app EMAIL...")
    main(sys.argv[1:])
