"""The table of every flag, its environment variable and its default, from the parser.

README.md carries this table between `<!-- flags:begin -->` and `<!-- flags:end -->`;
a test compares the two, so the documentation cannot drift from the code. Regenerate
it with `python -m forklift.cli.reference --update README.md`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

BEGIN, END = "<!-- flags:begin -->", "<!-- flags:end -->"
_TAIL = re.compile(r"\s*\(env ([A-Z0-9_, ]+?)(?:; default: (.*))?\)$", re.DOTALL)


@dataclass
class Flag:
    name: str
    env: str
    default: str
    help: str
    commands: list[str] = field(default_factory=list)


def commands(
    parser: argparse.ArgumentParser, prefix: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command that runs, by its full name (`jobs list`), with its parser."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if sub is None:
        yield prefix.strip(), parser
        return
    for name, p in sub.choices.items():
        yield from commands(p, f"{prefix}{name} ")


def _flags(parser: argparse.ArgumentParser) -> list[Flag]:
    found: dict[tuple[str, str, str, str], Flag] = {}
    for command, p in commands(parser):
        for action in p._actions:
            if not action.option_strings or action.help in (None, argparse.SUPPRESS):
                continue
            name = max(action.option_strings, key=len)
            if name == "--help":
                continue
            text = " ".join(str(action.help).split())
            match = _TAIL.search(text)
            env, default = (match[1], match[2] or "") if match else ("", "")
            what = _TAIL.sub("", text)
            flag = found.setdefault((name, what, env, default), Flag(name, env, default, what))
            flag.commands.append(command)
    return sorted(found.values(), key=lambda f: (f.name, f.commands))


def table(parser: argparse.ArgumentParser) -> str:
    """The markdown table of every flag of every command."""
    every = {command for command, _ in commands(parser)}
    lines = [
        "| flag | environment | default | commands | what it does |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in _flags(parser):
        env = ", ".join(f"`{e.strip()}`" for e in f.env.split(",")) if f.env else ""
        default = f"`{f.default}`" if f.default else ""
        where = "every command" if set(f.commands) == every else ", ".join(f.commands)
        lines.append(f"| `{f.name}` | {env} | {default} | {where} | {f.help} |")
    return "\n".join(lines)


def spliced(text: str, generated: str) -> str:
    """`text` with what stands between the markers replaced by `generated`."""
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"no {BEGIN} ... {END} block to fill")
    return f"{head}{BEGIN}\n{generated}\n{END}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    from forklift.cli import build_parser

    args = argparse.ArgumentParser(prog="python -m forklift.cli.reference")
    args.add_argument("--update", type=Path, help="rewrite the table in this file")
    ns = args.parse_args(argv)
    generated = table(build_parser())
    if ns.update is None:
        print(generated)
        return 0
    ns.update.write_text(spliced(ns.update.read_text(), generated))
    return 0


if __name__ == "__main__":
    sys.exit(main())
