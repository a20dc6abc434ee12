"""How much one operator command reads or changes at a time: the admin stores keep to
these, the CLI's help states them (kept here, apart from the stores, so that
`forklift --help` imports no database driver)."""

from __future__ import annotations

# How many jobs one `jobs list` looks through at most for its queue, task and error
# filters (newest first, of its state if it names one): the cost of a page is bounded
# whatever the table holds, and a page that comes out short says where to go on.
LIST_WINDOW = 50_000
BATCH = 500  # jobs per statement of a bulk retry or a purge: short transactions
DEAD_SHOWN = 5  # dead jobs `batches show` names
