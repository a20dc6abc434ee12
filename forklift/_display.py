"""Text for people and for terminals: control, bidi and zero-width characters made visible.

Handlers, producers and hosts write the text forklift shows (errors, tracebacks, names):
an escape sequence there would clear the operator's screen, rename a tmux pane or forge
a line of output, and a bidi override would make one name read as another. So every
character that a terminal acts on or that reorders or hides text is shown escaped, the
way Python writes it in a string literal (`\\x1b`, `\\u202e`); everything else, non-ASCII
letters included, is shown as it is.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from functools import lru_cache
from typing import Any

# Cc: C0 controls, DEL and C1 controls. Cf: format characters (bidi embeddings, overrides
# and isolates, the marks U+200E/U+200F/U+061C, zero-width space and joiners, word joiner,
# byte order mark, ...). Cs: lone surrogates. Zl/Zp: the line and paragraph separators,
# which some terminals and editors break lines at.
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

# Printable ASCII is always safe; anything else is looked at (most of it is letters).
_MAYBE = re.compile(r"[^\x20-\x7e]")
_MAYBE_BUT_NEWLINE = re.compile(r"[^\x20-\x7e\n]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def unsafe(ch: str) -> bool:
    """Whether a terminal would act on `ch`, or it would hide or reorder text around it."""
    return unicodedata.category(ch) in UNSAFE_CATEGORIES


@lru_cache(maxsize=1024)
def _visible(ch: str) -> str:
    if not unsafe(ch):
        return ch
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _sub(match: re.Match[str]) -> str:
    return _visible(match.group())


def line(text: object) -> str:
    """`text` as one line a terminal shows as it is: newlines, `\\r` and every other
    control, bidi or zero-width character escaped."""
    return _MAYBE.sub(_sub, str(text))


def block(text: object) -> str:
    """`text` as lines (a traceback): newlines stay line breaks, everything else that
    `line` escapes is escaped (a `\\r` too, which would overwrite the line it ends)."""
    return _MAYBE_BUT_NEWLINE.sub(_sub, str(text))


def clip(text: str | None, width: int) -> str:
    """`text` escaped as one line, at most `width` characters (`-` for none)."""
    if text is None or not text.strip():
        return "-"
    shown = line(text.strip())
    return shown if len(shown) <= width else shown[: max(0, width - 1)] + "…"


def _json_escape(match: re.Match[str]) -> str:
    ch = match.group()
    if not unsafe(ch):
        return ch
    code = ord(ch)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON spells a character beyond the BMP as a surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_text(value: Any, *, indent: int | None = 2) -> str:
    """`value` as JSON that is safe to print: like json.dumps(ensure_ascii=False), but
    DEL, C1 controls, bidi, zero-width and separator characters are `\\u` escapes too
    (json escapes only C0 itself), so `cat` of the output cannot drive a terminal."""
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    # Outside its strings JSON text is ASCII, and a raw newline there is indentation.
    return _MAYBE_BUT_NEWLINE.sub(_json_escape, text)


def from_here(path: str | os.PathLike[str]) -> str:
    """`path` as the user would type it from the current directory: relative to it when
    it lies within it (`app/jobs.py`, `.forklift`), else as given."""
    text, here = os.fspath(path), os.path.join(os.getcwd(), "")
    return text[len(here) :] if text.startswith(here) else text
