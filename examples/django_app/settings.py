"""The example's Django settings: one database from FORKLIFT_DATABASE_URL, one app.

Django's tables go in FORKLIFT_SCHEMA (the connection's search_path), beside forklift's,
as in forklift's other examples. In your project Django keeps its own schema (public, by
default); the worker names a model's table with its schema either way (orders/tasks.py).
"""

from __future__ import annotations

import os
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from psycopg.conninfo import conninfo_to_dict

FORKLIFT_SCHEMA = os.environ.get("FORKLIFT_SCHEMA", "forklift")


def database(url: str, schema: str) -> dict[str, Any]:
    """Django's DATABASES entry for a libpq URL (or key=value string), its tables in
    `schema`. Whatever the URL says beyond the five fields (sslmode=...) goes to libpq
    through OPTIONS."""
    params = conninfo_to_dict(url)
    options = f"{params.pop('options', '')} -c search_path={schema}".strip()
    return {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3 underneath
        "NAME": params.pop("dbname", ""),
        "USER": params.pop("user", ""),
        "PASSWORD": params.pop("password", ""),
        "HOST": params.pop("host", ""),
        "PORT": params.pop("port", ""),
        "OPTIONS": {**params, "options": options},
    }


_URL = os.environ.get("FORKLIFT_DATABASE_URL") or os.environ.get("DATABASE_URL")
if not _URL:
    raise ImproperlyConfigured(
        "set FORKLIFT_DATABASE_URL (postgresql://user@host/db): Django and forklift "
        "share that database"
    )
DATABASES = {"default": database(_URL, FORKLIFT_SCHEMA)}

INSTALLED_APPS = ["examples.django_app.orders"]
MIDDLEWARE: list[str] = []  # a JSON API without sessions: add your project's own
ROOT_URLCONF = "examples.django_app.urls"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
