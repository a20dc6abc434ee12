"""The orders API: an order, its job and its stock reservation in one transaction.

`create_order` is the way to enqueue from Django: `app.enqueue(..., conn=...)` inside
`transaction.atomic()`, on the psycopg connection under Django's. The job's row is
written in the request's transaction, so it commits with the order and the reservation
or rolls back with them: exactly one job per committed order and none for a rolled-back
one, whatever fails and wherever the process dies. (With ATOMIC_REQUESTS = True every
view runs in such a block already, and the enqueue joins it the same way.)

`create_order_on_commit` is the common alternative, for comparison:
`transaction.on_commit(lambda: fulfil_order.enqueue(...))` enqueues after Django's commit,
on forklift's own connection. A rolled-back request enqueues nothing there too, but the
commit and the enqueue are two steps: if the process dies (a deploy, the OOM killer) or
the database is unreachable between them, the order is committed and its job never
exists. That is at most once. Use it only where losing the job is acceptable, or where
Django's database is not forklift's (no transaction spans the two).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.models import F
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET, require_POST

from examples.django_app.orders.models import Order, Stock
from examples.django_app.orders.tasks import app, fulfil_order


class OutOfStock(Exception):
    """Not enough of the item is left for the order."""


def psycopg_connection() -> psycopg.Connection[Any]:
    """The psycopg connection under Django's: inside `transaction.atomic()` it is in
    that block's transaction, so what forklift inserts on it commits with the block."""
    connection.ensure_connection()
    conn = connection.connection
    if not isinstance(conn, psycopg.Connection):
        raise ImproperlyConfigured(
            "forklift enqueues on a psycopg 3 connection: use Django's postgresql backend "
            f"with psycopg (3) installed, not {type(conn).__module__}"
        )
    return conn


def parse_order(body: bytes) -> tuple[str, int]:
    """The item and quantity a POST asks for; ValueError saying what is wrong otherwise."""
    try:
        order = json.loads(body)
    except ValueError:
        raise ValueError('the body must be JSON: {"item": "apple", "quantity": 2}') from None
    item = order.get("item") if isinstance(order, dict) else None
    quantity = order.get("quantity") if isinstance(order, dict) else None
    if not isinstance(item, str) or not 0 < len(item) <= 100:
        raise ValueError('"item" must be a string of 1 to 100 characters')
    if type(quantity) is not int or quantity < 1:
        raise ValueError('"quantity" must be a whole number, 1 or more')
    return item, quantity


def reserve(item: str, quantity: int) -> None:
    """Take `quantity` of `item` from the stock, or raise OutOfStock."""
    taken = Stock.objects.filter(item=item, available__gte=quantity).update(
        available=F("available") - quantity
    )
    if not taken:
        raise OutOfStock(f"not enough {item!r} left for {quantity}")


@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    """The order, its job and its reservation commit together, or none of them does."""
    try:
        item, quantity = parse_order(request.body)
        with transaction.atomic():
            order = Order.objects.create(item=item, quantity=quantity)
            order.job_id = app.enqueue(
                "fulfil_order", {"order_id": order.pk}, conn=psycopg_connection()
            )
            order.save(update_fields=["job_id"])
            reserve(item, quantity)  # OutOfStock rolls back the order and its job too
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    except OutOfStock as exc:
        return JsonResponse({"error": str(exc)}, status=409)
    return JsonResponse({"id": order.pk, "job_id": order.job_id}, status=201)


@require_POST
def create_order_on_commit(request: HttpRequest) -> JsonResponse:
    """For comparison (see the module's docstring): the job is enqueued after the commit,
    and is lost if the process dies between the two."""
    try:
        item, quantity = parse_order(request.body)
        with transaction.atomic():
            order = Order.objects.create(item=item, quantity=quantity)
            reserve(item, quantity)
            transaction.on_commit(lambda: fulfil_order.enqueue(order_id=order.pk))
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    except OutOfStock as exc:
        return JsonResponse({"error": str(exc)}, status=409)
    return JsonResponse({"id": order.pk}, status=201)


@require_GET
def show_order(request: HttpRequest, order_id: int) -> JsonResponse:
    order = Order.objects.filter(pk=order_id).first()
    if order is None:
        return JsonResponse({"error": f"no order {order_id}"}, status=404)
    return JsonResponse(
        {
            "id": order.pk,
            "item": order.item,
            "quantity": order.quantity,
            "status": order.status,
            "job_id": order.job_id,
        }
    )
