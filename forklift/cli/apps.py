"""Which app and database a command works on: MODULE:APP if it names one, else --dsn."""

from __future__ import annotations

import argparse

from forklift import _config
from forklift.app import App


def app_for(args: argparse.Namespace) -> App:
    """The app named by `args.app` (its DSN overridden by --dsn), else a bare App; its
    database URL checked, so a malformed one stops the command here (exit 2)."""
    target = getattr(args, "app", None)
    if target:
        app = _config.load_app(target)
        if args.dsn:
            app._dsn = args.dsn
    else:
        app = App(args.dsn, schema=args.schema)
    app.dsn  # noqa: B018 - resolves and checks it (DsnError, ConfigError)
    return app
