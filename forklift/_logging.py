"""Log setup: one JSON object per line (default) or plain text; DSNs always redacted, and
what a terminal would act on always escaped."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from forklift import _display
from forklift._redact import redact


class JsonFormatter(logging.Formatter):
    """{"ts", "level", "logger", "event", "msg", ...fields} on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        event = getattr(record, "event", None)
        if event:
            entry["event"] = event
        entry["msg"] = redact(record.getMessage())
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                if key not in entry:
                    entry[key] = (
                        value
                        if isinstance(value, int | float | bool) or value is None
                        else redact(str(value))
                    )
        entry["pid"] = record.process
        if record.exc_info:
            entry["exc"] = redact(self.formatException(record.exc_info))
        return _display.json_text(entry, indent=None)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record, self.datefmt)
        # The message stays one line whatever it holds (a newline in it would forge a log
        # line); a traceback keeps its line breaks, and only those.
        text = _display.line(redact(self.formatMessage(record)))
        if record.exc_info:
            text += "\n" + _display.block(redact(self.formatException(record.exc_info)))
        elif record.exc_text:  # formatted elsewhere already (another handler, a child)
            text += "\n" + _display.block(redact(record.exc_text))
        if record.stack_info:
            text += "\n" + _display.block(redact(self.formatStack(record.stack_info)))
        return text


def setup(level: str = "INFO", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Route forklift's (and the app's) logs to `stream` (stdout) in the chosen format:
    "json", "text", or "auto" (text when the stream is a terminal, else JSON)."""
    out = stream or sys.stdout
    if fmt == "auto":
        fmt = "text" if out.isatty() else "json"
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # psycopg_pool logs every failed connection attempt (several a second while the
    # database is away); forklift's own events say so once, calmly, with the cause.
    logging.getLogger("psycopg.pool").setLevel(max(logging.getLevelName(level), logging.ERROR))
