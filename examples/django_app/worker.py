"""The workers' entry point: `forklift run examples.django_app.worker:app`.

Django is set up before the tasks are imported (their module reads the settings and the
models). The supervisor does this once, before it forks its workers; django.setup()
opens no database connection, so none crosses the fork.
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
django.setup()

from examples.django_app.orders.tasks import app  # noqa: E402  (after django.setup())

__all__ = ["app"]
