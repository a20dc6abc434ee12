"""Which app and database a command works on: MODULE:APP if it names one, else --dsn;
and the operator's stores on it (imported by the commands that connect, only)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from forklift import _loading

if TYPE_CHECKING:
    from forklift.admin import AdminStore, JobAdmin
    from forklift.admin.batches import BatchAdmin
    from forklift.app import App


def app_for(args: argparse.Namespace) -> App:
    """The app named by `args.app` (its DSN overridden by --dsn), else a bare App; its
    database URL checked, so a malformed one stops the command here (exit 2)."""
    from forklift.app import App  # imported by the commands that use one, only

    target = getattr(args, "app", None)
    if target:
        app = _loading.load_app(target)
        if args.dsn:
            app._dsn = args.dsn
    else:
        app = App(args.dsn, schema=args.schema)
    app.dsn  # noqa: B018 - resolves and checks it (DsnError, ConfigError)
    return app


def admin_store(app: App) -> AdminStore:
    """Queue statistics, paused queues, limits and processes on `app`'s database."""
    from forklift.admin import AdminStore

    return AdminStore(app.dsn, app.schema)


def job_admin(app: App, store: AdminStore | None = None) -> JobAdmin:
    """The jobs on `app`'s database (on `store`'s connections, if given)."""
    from forklift.admin import JobAdmin

    return JobAdmin(app.dsn, app.schema, None if store is None else store.connector)


def batch_admin(app: App) -> BatchAdmin:
    """The batches on `app`'s database."""
    from forklift.admin.batches import BatchAdmin

    return BatchAdmin(app.dsn, app.schema)
