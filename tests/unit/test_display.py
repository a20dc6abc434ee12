"""The one escaper of text shown to people, and the names that refuse what it escapes."""

from __future__ import annotations

import json
import logging

import pytest

from forklift import _display, _names
from forklift._logging import JsonFormatter, TextFormatter
from forklift.shown import output

HOSTILE = "\x1b[2J\x1b[H\x1b[31mFAKE\x1b]2;pwned\x07 \r\n  attempts 0 of 0\x9b\x7f\u202eevil"


def test_line_escapes_controls_bidi_and_zero_width_and_keeps_letters() -> None:
    assert _display.line("\x1b[31m") == "\\x1b[31m"
    assert _display.line("a\r\nb\tc") == "a\\r\\nb\\tc"
    assert _display.line("\x00\x07\x7f\x9b\x85") == "\\x00\\x07\\x7f\\x9b\\x85"
    assert _display.line("\u202eabc\u202c") == "\\u202eabc\\u202c"
    for ch in "\u202a\u202b\u202d\u2066\u2067\u2068\u2069\u200e\u200f\u061c":
        assert _display.line(ch) == f"\\u{ord(ch):04x}"
    for ch in "\u200b\u200c\u200d\u2060\ufeff\u2028\u2029":
        assert _display.line(ch) == f"\\u{ord(ch):04x}"
    assert _display.line("\U000e0041") == "\\U000e0041"  # a tag character (Cf)
    assert _display.line("\ud800") == "\\ud800"  # a lone surrogate
    assert _display.line("žličar 東京 café ✓ \\x1b") == "žličar 東京 café ✓ \\x1b"


def test_nothing_a_terminal_acts_on_survives_escaping() -> None:
    shown = _display.line(HOSTILE)
    assert shown.isprintable() and shown.isascii()
    assert not any(_display.unsafe(ch) for ch in shown)
    block = _display.block(HOSTILE + "\nTraceback line 2")
    assert block.split("\n")[-1] == "Traceback line 2" and block.count("\n") == 2
    assert "\r" not in block and "\\r\n" in block


def test_clip_escapes_then_bounds_the_width() -> None:
    assert output.clip(None, 10) == "-" and output.clip("  \n ", 10) == "-"
    assert output.clip("first\r\nsecond", 60) == "first\\r\\nsecond"
    clipped = output.clip("\x1b" * 50, 20)
    assert len(clipped) == 20 and clipped.endswith("…") and "\x1b" not in clipped


def test_json_text_escapes_what_json_leaves_raw() -> None:
    value = {"error": HOSTILE, "astral": "\U000e0041", "name": "žličar"}
    text = _display.json_text(value)
    assert json.loads(text) == value  # still the same JSON
    assert not any(_display.unsafe(ch) for ch in text.replace("\n", ""))
    assert "žličar" in text and "\\u202e" in text and "\\u009b" in text
    assert "\\udb40\\udc41" in text  # a surrogate pair, as JSON spells it


def test_table_cells_are_escaped_and_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    output.table(("name", "n"), [("\x1b]2;x\x07" + "q" * 500, 1)], empty="none")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "\x1b" not in lines[1] and "\\x1b]2;x\\x07" in lines[1]
    assert all(len(line) <= output.CELL_CHARS + 10 for line in lines)


def _record(msg: str, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise RuntimeError(HOSTILE)
        except RuntimeError:
            import sys

            info = sys.exc_info()
    return logging.LogRecord("forklift.x", logging.ERROR, __file__, 1, msg, None, info)


def test_text_logs_escape_messages_and_tracebacks() -> None:
    text = TextFormatter().format(_record(HOSTILE, exc=True))
    assert not any(_display.unsafe(ch) for ch in text.replace("\n", ""))
    first, *rest = text.split("\n")
    assert first.endswith(_display.line(HOSTILE))  # the message stays one line
    assert rest[0] == "Traceback (most recent call last):"  # the traceback keeps its lines


def test_json_logs_escape_what_json_leaves_raw() -> None:
    text = JsonFormatter().format(_record(HOSTILE, exc=True))
    assert "\n" not in text and not any(_display.unsafe(ch) for ch in text)
    assert json.loads(text)["msg"] == HOSTILE


@pytest.mark.parametrize(
    "ch",
    [
        *"\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c",
        *"\u200b\u200c\u200d\u2060\ufeff\u2028\u2029\x7f\x85\x9b\x1b\n",
    ],
)
def test_names_refuse_bidi_zero_width_separators_and_controls(ch: str) -> None:
    for kind in ("task", "queue", "idempotency key", "schedule"):
        with pytest.raises(ValueError, match=f"U\\+{ord(ch):04X}\\) at position 3"):
            _names.check(kind, f"abc{ch}def")


def test_names_say_what_kind_of_character_they_refuse() -> None:
    with pytest.raises(ValueError, match=r"a bidi control \(U\+202E\)"):
        _names.check("task", "a\u202eb")
    with pytest.raises(ValueError, match=r"a zero-width character \(U\+200B\)"):
        _names.check("queue", "a\u200bb")
    with pytest.raises(ValueError, match=r"a line or paragraph separator \(U\+2028\)"):
        _names.check("schedule", "a\u2028b")
    with pytest.raises(ValueError, match=r"a control character \(U\+009B\)"):
        _names.check("idempotency key", "a\x9bb")


def test_names_keep_accepting_letters_of_any_script() -> None:
    for name in ("render", "žličar", "東京-queue", "emails.v2", "a b", "café/ünïcode"):
        assert _names.check("task", name) == name
