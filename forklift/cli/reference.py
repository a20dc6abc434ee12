"""The CLI reference, generated from the parser: every command with its help, usage,
flags, environment variables, defaults and examples, and the table of every flag.

The documentation site writes its CLI page from `page()` at every build (docs/hooks.py),
so the page cannot drift from the code: a renamed flag or a new command is on it the
next time the site is built. `python -m forklift.cli.reference` prints that page;
`--table`, the table of every flag only.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

_TAIL = re.compile(r"\s*\(env ([A-Z0-9_, ]+?)(?:; default: (.*))?\)$", re.DOTALL)
_USAGE_WIDTH = 88  # usage lines wrap here, whatever terminal builds the page
_MARKDOWN = re.compile(r"([\\*_<>\[\]|])")  # what prose must escape outside `code`


@dataclass
class Flag:
    name: str
    env: str
    default: str
    help: str
    commands: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Command:
    """A command or a group of commands (`jobs`), by its full name, with its parser and
    the line its group's --help gives it."""

    name: str
    parser: argparse.ArgumentParser
    summary: str
    group: bool


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[Any] | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def commands(
    parser: argparse.ArgumentParser, prefix: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command that runs, by its full name (`jobs list`), with its parser."""
    sub = _subparsers(parser)
    if sub is None:
        yield prefix.strip(), parser
        return
    for name, p in sub.choices.items():
        yield from commands(p, f"{prefix}{name} ")


def walk(parser: argparse.ArgumentParser, prefix: str = "", summary: str = "") -> Iterator[Command]:
    """The command of `parser` and every one below it, groups before their commands, in
    the order `--help` lists them (an alias is listed once, under its first name)."""
    sub = _subparsers(parser)
    yield Command(prefix.strip(), parser, summary, sub is not None)
    if sub is None:
        return
    helps = {a.dest: str(a.help or "") for a in sub._choices_actions}
    seen: set[int] = set()
    for name, p in sub.choices.items():
        if id(p) not in seen:
            seen.add(id(p))
            yield from walk(p, f"{prefix}{name} ", helps.get(name, ""))


def _documented(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """The flags and arguments of `parser` a reader is told about (not --help, not the
    choice of a subcommand, which is listed as commands)."""
    for action in parser._actions:
        if action.help in (None, argparse.SUPPRESS) or "--help" in action.option_strings:
            continue
        if not isinstance(action, argparse._SubParsersAction):
            yield action


def _split(action: argparse.Action) -> tuple[str, str, str]:
    """An action's help as (what it does, environment variables, default)."""
    text = " ".join(str(action.help).split())
    match = _TAIL.search(text)
    env, default = (match[1], match[2] or "") if match else ("", "")
    return _TAIL.sub("", text), env, default


def _flags(parser: argparse.ArgumentParser) -> list[Flag]:
    found: dict[tuple[str, str, str, str], Flag] = {}
    for command, p in commands(parser):
        for action in _documented(p):
            if not action.option_strings:
                continue
            name = max(action.option_strings, key=len)
            what, env, default = _split(action)
            flag = found.setdefault((name, what, env, default), Flag(name, env, default, what))
            flag.commands.append(command)
    return sorted(found.values(), key=lambda f: (f.name, f.commands))


def _env(names: str) -> str:
    return ", ".join(f"`{e.strip()}`" for e in names.split(",")) if names else ""


def table(parser: argparse.ArgumentParser) -> str:
    """The markdown table of every flag of every command."""
    every = {command for command, _ in commands(parser)}
    lines = [
        "| flag | environment | default | commands | what it does |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in _flags(parser):
        default = f"`{f.default}`" if f.default else ""
        where = "every command" if set(f.commands) == every else ", ".join(f.commands)
        lines.append(f"| `{f.name}` | {_env(f.env)} | {default} | {where} | {prose(f.help)} |")
    return "\n".join(lines)


def _shared(parser: argparse.ArgumentParser) -> set[str]:
    """The flags every command has, alike (--log-level, --debug, ...): told once."""
    every = {command for command, _ in commands(parser)}
    return {f.name for f in _flags(parser) if set(f.commands) == every}


def prose(text: str) -> str:
    """Text (a help, a comment) as one Markdown paragraph: what Markdown would read as
    markup is escaped, except inside `code`."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    return "".join(p if p.startswith("`") else _MARKDOWN.sub(r"\\\1", p) for p in parts)


def help_text(text: str) -> str:
    """A description or epilog as Markdown: its prose paragraphs as paragraphs, and what
    it lays out itself (`examples:` and their indented lines, tables) as text blocks,
    exactly as `--help` prints it."""
    blocks = []
    for para in re.split(r"\n[ \t]*\n", text.strip("\n")):
        lines = para.rstrip().splitlines()
        indented = [line for line in lines[1:] if line.startswith(" ")]
        if len(lines) > 1 and lines[0].endswith(":") and len(indented) == len(lines) - 1:
            body = textwrap.dedent("\n".join(lines[1:]))
            blocks.append(f"{prose(lines[0])}\n\n```text\n{body}\n```")
        elif any(line.startswith(" ") for line in lines):
            blocks.append(f"```text\n{textwrap.dedent(para)}\n```")
        else:
            blocks.append(prose(para))
    return "\n\n".join(blocks)


def usage(parser: argparse.ArgumentParser) -> str:
    """The usage lines of `parser`, wrapped at a fixed width."""
    formatter = argparse.HelpFormatter(parser.prog, width=_USAGE_WIDTH)  # usage reads alike
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _arguments(parser: argparse.ArgumentParser, shared: set[str]) -> str:
    """The table of the command's own arguments and flags ('' if it has none)."""
    formatter = parser._get_formatter()
    rows = []
    for action in _documented(parser):
        if action.option_strings and max(action.option_strings, key=len) in shared:
            continue
        what, env, default = _split(action)
        shown = formatter._format_action_invocation(action)
        default = f"`{default}`" if default else ""
        rows.append(f"| `{shown}` | {_env(env)} | {default} | {prose(what)} |")
    if not rows:
        return ""
    head = "| argument | environment | default | what it does |\n| --- | --- | --- | --- |"
    return "\n".join([head, *rows])


def anchor(name: str) -> str:
    """The id of a command's section on the page (`forklift-jobs-list`)."""
    return "-".join(["forklift", *name.split()])


def section(command: Command, shared: set[str]) -> str:
    """One command's section: its summary, usage, description, arguments and epilog."""
    p = command.parser
    title = f"forklift {command.name}"
    level = "#" * (2 + command.name.count(" "))
    parts = [f"{level} {title} {{#{anchor(command.name)}}}"]
    if command.summary:
        parts.append(prose(command.summary[:1].upper() + command.summary[1:]) + ".")
    parts.append(f"```text\n{usage(p)}\n```")
    if p.description:
        parts.append(help_text(p.description))
    parts.append(_arguments(p, shared))
    if p.epilog:
        parts.append(help_text(p.epilog))
    return "\n\n".join(part for part in parts if part)


INTRO = """\
# CLI reference

This page is generated from forklift's own argument parser
(`forklift.cli.build_parser()`) each time the site is built: every command, its help,
its flags with their environment variables and defaults, and its examples are the ones
`forklift COMMAND --help` prints. Configuration comes from flags, then `FORKLIFT_*`
environment variables, then the defaults.
"""


def page(parser: argparse.ArgumentParser) -> str:
    """The whole CLI reference page, in Markdown."""
    shared = _shared(parser)
    top, *below = list(walk(parser))
    index = ["| command | what it does |", "| --- | --- |"]
    for c in below:
        index.append(f"| [`forklift {c.name}`](#{anchor(c.name)}) | {prose(c.summary)} |")
    every = [f for f in _flags(parser) if f.name in shared]
    common = "\n".join(f"- `{f.name}`: {prose(f.help)}" for f in every)
    parts = [
        INTRO,
        f"```text\n{usage(top.parser)}\n```",
        help_text(top.parser.description or ""),
        help_text(top.parser.epilog or ""),
        "\n".join(index),
        f"Every command also takes:\n\n{common}",
        *(section(c, shared) for c in below),
        "## Every flag {#every-flag}\n\nEach flag once, with every command that takes it.",
        table(parser),
    ]
    return "\n\n".join(part for part in parts if part) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    from forklift.cli import build_parser

    args = argparse.ArgumentParser(prog="python -m forklift.cli.reference")
    args.add_argument("--table", action="store_true", help="only the table of every flag")
    ns = args.parse_args(argv)
    parser = build_parser()
    print(table(parser) if ns.table else page(parser), end="\n" if ns.table else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
