"""The orders app's tables (made by `manage makemigrations`)."""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations, models
from django.db.migrations.operations.base import Operation


class Migration(migrations.Migration):
    initial = True

    dependencies: ClassVar[list[tuple[str, str]]] = []

    operations: ClassVar[list[Operation]] = [
        migrations.CreateModel(
            name="Order",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("item", models.CharField(max_length=100)),
                ("quantity", models.PositiveIntegerField()),
                ("status", models.CharField(default="pending", max_length=20)),
                ("job_id", models.BigIntegerField(null=True, unique=True)),
                ("fulfilled_at", models.DateTimeField(null=True)),
            ],
        ),
        migrations.CreateModel(
            name="Stock",
            fields=[
                ("item", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("available", models.PositiveIntegerField()),
            ],
        ),
    ]
