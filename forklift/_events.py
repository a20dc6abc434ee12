"""Named lifecycle events, logged as one line each with their fields attached."""

from __future__ import annotations

import logging
from typing import Any


def emit(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log `event` with `fields` (never job arguments or credentials)."""
    if not logger.isEnabledFor(level):
        return
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    logger.log(level, "%s %s", event, text, extra={"event": event, "fields": fields})
