"""Names a producer or a task declaration gives: task, queue, idempotency key, schedule.

Checked at declaration and at enqueue, never stored when bad: a name is a non-empty
string of at most its kind's length, with no control character (a newline in a task name
once reached the supervisor's report pipe), no character that hides or reorders text (a
bidi override makes one name read as another in every terminal and log) and valid
Unicode (no lone surrogate, which the database cannot store).
"""

from __future__ import annotations

import functools
import itertools
import unicodedata
from collections.abc import Iterable
from typing import Any

from forklift import _display

# Task, queue and schedule names appear in logs, metrics labels and process titles:
# short. Idempotency keys are often built from data (a path, a URL), so they get more
# room, still well inside a btree index row (2,704 bytes; a UTF-8 character is at most 4).
MAX_NAME = 200
MAX_KEY = 512
# Idempotency keys forklift writes itself (a schedule's fires): no producer may take one.
RESERVED_KEY_PREFIX = "forklift:"


_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
_ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff")


def _what(ch: str) -> str:
    if ch in _BIDI:
        return "a bidi control"
    if ch in _ZERO_WIDTH:
        return "a zero-width character"
    if ch in "\u2028\u2029":
        return "a line or paragraph separator"
    if "\ud800" <= ch <= "\udfff":
        return "a lone surrogate"
    return "a control character" if unicodedata.category(ch) == "Cc" else "a format character"


def _problem(value: Any, limit: int) -> str | None:
    if not isinstance(value, str):
        return f"must be a string, not {type(value).__name__}"
    if not value:
        return "must not be empty"
    if len(value) > limit:
        return f"is {len(value)} characters long; the limit is {limit}"
    # What a terminal would act on, or what would hide or reorder text: the characters
    # the display escapes (forklift._display), so no name needs escaping to be read.
    # Every one of them is unprintable to str.isprintable, which looks in C.
    if value.isprintable():
        return None
    for i, ch in enumerate(value):
        if _display.unsafe(ch):
            return f"contains {_what(ch)} (U+{ord(ch):04X}) at position {i}"
    return None


def check(kind: str, value: Any, *, limit: int = MAX_NAME) -> str:
    """Return `value` if it is a good `kind` name (task, queue, ...), else raise ValueError.

    Callers turn the ValueError into their own error (ConfigError at declaration,
    ArgumentError at enqueue); the message names the kind and shows the value safely.
    """
    problem = _problem(value, limit)
    if problem is not None:
        shown = ascii(value)[:80] if isinstance(value, str) else type(value).__name__
        raise ValueError(f"{kind} name {shown} {problem}")
    return str(value)


def check_labels(value: Any) -> tuple[str, ...]:
    """Worker labels (`forklift run --labels`, a task's `requires=`) as stored: sorted and
    unique, each a good name (see check) without a comma or surrounding spaces, since
    jobs.requires holds them joined by commas; else ValueError."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"labels are a set of names, e.g. {{'gpu'}}, not {value!r:.80}")
    labels = {check("label", label) for label in value}
    for label in labels:
        if "," in label or label != label.strip():
            raise ValueError(
                f"label {ascii(label)[:80]} has a comma or a space at an end: labels are "
                "given as a comma-separated list (forklift run --labels gpu,model-x)"
            )
    return tuple(sorted(labels))


# The labels one worker may have: its labelled claim probes every set of them
# (label_sets: 2^n - 1 of them, 1,023 at most).
MAX_LABELS = 10


@functools.lru_cache(maxsize=16)
def label_sets(labels: tuple[str, ...]) -> list[str]:
    """Every non-empty set of `labels` (sorted, as check_labels gives them) as
    jobs.requires holds one: joined by commas, in sorted order. A job a worker with
    `labels` may run requires one of them."""
    return [
        ",".join(chosen)
        for n in range(1, len(labels) + 1)
        for chosen in itertools.combinations(labels, n)
    ]


def check_key(value: Any) -> str:
    """Return `value` if a producer may give it as an idempotency key, else ValueError:
    a good name (see check) outside forklift's own `forklift:` namespace."""
    key = check("idempotency key", value, limit=MAX_KEY)
    if key.startswith(RESERVED_KEY_PREFIX):
        raise ValueError(
            f"idempotency key {ascii(key)[:80]} starts with {RESERVED_KEY_PREFIX!r}, "
            "which forklift reserves for its own jobs (a schedule's fires): choose another"
        )
    return key
