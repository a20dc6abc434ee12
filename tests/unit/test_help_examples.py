"""Every command's --help ends with examples, and every `forklift ...` in them parses.

An example is a line of shell: the `forklift` invocations in it (in a pipeline, after
VAR=value assignments, inside $(...)) are parsed with the CLI's own parser, so an
example cannot name a flag, a choice or a value that the command does not take.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import re
import shlex
from collections.abc import Iterator

import pytest

from forklift.cli import build_parser

HEADER = "examples:"
_SUBSTITUTION = re.compile(r"\$\(([^()]*)\)")  # $(...), not nested
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_SEPARATORS = {"|", "||", "&&", ";", "&"}
_REDIRECTS = {">", ">>", "<"}


def commands(
    parser: argparse.ArgumentParser, name: str = "forklift"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """`forklift` itself, and every command and subcommand, by its full name."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word, sub in action.choices.items():
                yield from commands(sub, f"{name} {word}")


def examples(help_text: str) -> list[str]:
    """The lines of the examples section that ends `help_text` ([] if it ends otherwise):
    every line after the last `examples:`, each indented, none blank."""
    lines = help_text.rstrip("\n").splitlines()
    if HEADER not in lines:
        return []
    section = lines[len(lines) - lines[::-1].index(HEADER) :]
    return section if all(line.startswith("  ") and line.strip() for line in section) else []


def invocations(line: str) -> list[list[str]]:
    """The arguments of each `forklift` command `line` runs (a substitution stands as 1,
    the id a script would put there); other commands (jq, rm) are not forklift's."""
    found = [argv for inner in _SUBSTITUTION.findall(line) for argv in invocations(inner)]
    lexer = shlex.shlex(_SUBSTITUTION.sub("1", line), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True  # '#' starts a comment, as in a shell
    words: list[str] = []
    tokens = iter([*lexer, ";"])
    for token in tokens:
        if token in _REDIRECTS:
            next(tokens, None)  # the file it names
        elif token in _SEPARATORS:
            command = list(itertools.dropwhile(_ASSIGNMENT.match, words))
            if command[:1] == ["forklift"]:
                found.append(command[1:])
            words = []
        else:
            words.append(token)
    return found


def parse_error(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """What the parser says about `argv` (None: it parses)."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit:
        return said.getvalue().strip() or "exited"
    return None


PARSER = build_parser()
COMMANDS = dict(commands(PARSER))


def test_every_command_is_checked() -> None:
    # The walk reaches into groups: a command added anywhere gets checked.
    assert {"forklift run", "forklift jobs list", "forklift batches cancel"} <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_ends_with_examples_of_the_command_that_parse(name: str) -> None:
    text = COMMANDS[name].format_help()
    lines = examples(text)
    assert lines, f"`{name} --help` does not end with an {HEADER!r} section:\n{text}"
    found = [(line, argv) for line in lines for argv in invocations(line)]
    own = name.split()[1:]
    assert any(argv[: len(own)] == own for _, argv in found), (
        f"no example of `{name} --help` runs `{name}`: {lines}"
    )
    errors = [
        f"{line.strip()!r}: {error}"
        for line, argv in found
        if (error := parse_error(PARSER, argv)) is not None
    ]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("  forklift status", [["status"]]),
        ("  forklift top --once     # one frame", [["top", "--once"]]),
        (
            "  forklift ps --json | jq '.[] | select(.x == \"y\") | .id'",
            [["ps", "--json"]],
        ),
        (
            "  FORKLIFT_DASHBOARD_TOKEN=$(openssl rand -hex 16) forklift dashboard",
            [["dashboard"]],
        ),
        (
            "  forklift jobs cancel $(forklift jobs list --json | jq '.jobs[].id')",
            [["jobs", "list", "--json"], ["jobs", "cancel", "1"]],
        ),
        (
            "  forklift jobs list --json > dead.json && rm -r .forklift",
            [["jobs", "list", "--json"]],
        ),
        ("  rm -r .forklift", []),
    ],
)
def test_the_invocations_of_a_line_of_shell(line: str, expected: list[list[str]]) -> None:
    assert invocations(line) == expected


def test_a_wrong_example_is_caught() -> None:
    # What the test above finds in a help text: the error, and which line has it.
    [argv] = invocations("  forklift jobs list --state lost")
    assert "invalid choice: 'lost'" in (parse_error(PARSER, argv) or "")
    assert examples("usage: forklift x\n\nexamples:\n  forklift x\n\nmore text\n") == []
