"""An order, and the stock it draws on.

The fields are annotated (`CharField[set, get]`) so that mypy types them without
django-stubs' mypy plugin.
"""

from __future__ import annotations

from datetime import datetime

from django.db import models


class Stock(models.Model):
    """How many of an item may still be ordered."""

    item: models.CharField[str, str] = models.CharField(max_length=100, primary_key=True)
    available: models.PositiveIntegerField[int, int] = models.PositiveIntegerField()


class Order(models.Model):
    """An order: pending until its job (`job_id`) fulfils it in the worker."""

    item: models.CharField[str, str] = models.CharField(max_length=100)
    quantity: models.PositiveIntegerField[int, int] = models.PositiveIntegerField()
    status: models.CharField[str, str] = models.CharField(max_length=20, default="pending")
    # The forklift job that fulfils the order.
    job_id: models.BigIntegerField[int | None, int | None] = models.BigIntegerField(
        null=True, unique=True
    )
    fulfilled_at: models.DateTimeField[datetime | None, datetime | None] = models.DateTimeField(
        null=True
    )
