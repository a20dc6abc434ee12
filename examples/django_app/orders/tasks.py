"""The forklift App, configured from Django's settings, and the task that fulfils an order.

The App connects where Django does: its DSN is made from Django's own connection
parameters for DATABASES["default"] (host, user, sslmode, ... whatever settings say).

The worker's write goes through `ctx.transaction()`, forklift's connection whose
transaction commits the job's completion too: that is what makes it happen once. It is
SQL, not the ORM, because Django's ORM cannot be pointed at that connection: Django
opens its database connections itself, from settings, and keeps their autocommit and
atomic-block state itself; it has no public way to adopt a connection it did not open
(setting `connection.connection` by hand is Django's internals, and Django would then
manage, commit or close forklift's transaction as its own). The table name still comes
from the model.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connections
from psycopg import pq
from psycopg.conninfo import make_conninfo

import forklift
from examples.django_app.orders.models import Order

# What libpq takes; Django's connection parameters also hold its own (cursor_factory...).
LIBPQ_KEYWORDS = frozenset(option.keyword.decode() for option in pq.Conninfo.get_defaults())


def django_dsn(alias: str = "default") -> str:
    """A libpq connection string for Django's database `alias`, as Django connects to it.
    Opens no connection."""
    params = connections[alias].get_connection_params()
    return make_conninfo(
        **{key: value for key, value in params.items() if key in LIBPQ_KEYWORDS and value}
    )


app = forklift.App(django_dsn(), schema=settings.FORKLIFT_SCHEMA)

# The worker's connection has no search_path of Django's: name the schema (settings.py
# puts Django's tables in FORKLIFT_SCHEMA; yours may be in "public").
ORDERS = f'"{settings.FORKLIFT_SCHEMA}"."{Order._meta.db_table}"'
FULFIL = f"""
UPDATE {ORDERS} SET status = 'fulfilled', fulfilled_at = now()
WHERE id = %s AND status = 'pending'
RETURNING item, quantity
"""


@app.task(max_attempts=3, timeout=30.0)
def fulfil_order(ctx: forklift.JobContext, *, order_id: int) -> dict[str, Any]:
    """Mark the order fulfilled, committed with the job's completion: a retry after a
    crash finds it done or not at all, never half. The returned dict is the job's
    result (`app.result(job_id)`)."""
    with ctx.transaction() as conn:
        row = conn.execute(FULFIL, (order_id,)).fetchone()
    if row is None:  # no such order, or not pending: nothing to do
        return {"order_id": order_id, "fulfilled": False}
    item, quantity = row
    return {"order_id": order_id, "fulfilled": True, "item": item, "quantity": quantity}
