"""`manage stock ITEM COUNT`: set how many of ITEM may be ordered."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from examples.django_app.orders.models import Stock


class Command(BaseCommand):
    help = "Set how many of ITEM may be ordered."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("item")
        parser.add_argument("count", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        Stock.objects.update_or_create(
            item=options["item"], defaults={"available": options["count"]}
        )
        self.stdout.write(f"{options['item']}: {options['count']} available")
