"""A test app whose first worker process wedges right after its fork, before it boots (as
one would on a lock another thread of the parent held at the fork): it blocks forever in
a fork hook. Its later worker processes boot as usual. The marker file $FORKLIFT_TEST_WEDGED
says the first one has been forked."""

from __future__ import annotations

import os
import select

import forklift

app = forklift.App()


@app.task(name="noop")
def noop(ctx: forklift.JobContext) -> None:
    pass


def _wedge_the_first_child() -> None:
    try:
        fd = os.open(os.environ["FORKLIFT_TEST_WEDGED"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    select.select([], [], [])  # never returns


os.register_at_fork(after_in_child=_wedge_the_first_child)
