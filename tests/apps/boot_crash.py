"""A test app whose worker processes die while booting, before their worker loop runs
(as one would whose native library crashes in a fork hook)."""

from __future__ import annotations

import os

import forklift

app = forklift.App()


@app.task(name="noop")
def noop(ctx: forklift.JobContext) -> None:
    pass


os.register_at_fork(after_in_child=lambda: os._exit(9))
