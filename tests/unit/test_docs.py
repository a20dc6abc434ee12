"""The documentation stays true: the site builds strictly (links, anchors, the pages
generated from the code), README.md stays small, its links resolve, every Python example
compiles (and runs, unless it is marked a fragment), every `forklift ...` line of a shell
block parses with forklift's own parser, and every invariant the code cites by number is
on the design page."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import forklift
from forklift.cli import build_parser, reference

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
FRAGMENT = "<!-- fragment -->"  # before a Python block that cannot run on its own
README_MAX_BYTES = 10_240
SHELLS = {"sh", "bash", "shell", "console"}
OPERATORS = {"|", "||", "&", "&&", ";", ";;", "<", ">", ">>", "(", ")"}
_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)[^\n`]*$")


@dataclass(frozen=True)
class Block:
    """A fenced code block: where its code starts (file, line), its language, its code,
    and whether the line before it marks it a fragment."""

    path: Path
    line: int
    lang: str
    code: str
    fragment: bool

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def fenced(path: Path) -> Iterator[Block]:
    """The fenced code blocks of a Markdown file (indented ones in lists too)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, start = opening["indent"], i + 1
        end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
        code = "\n".join(line[len(indent) :] for line in lines[start:end]) + "\n"
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        yield Block(path, start + 1, opening["lang"], code, before == FRAGMENT)
        i = end + 1


def blocks(*langs: str) -> list[Block]:
    return [b for page in PAGES for b in fenced(page) if b.lang in langs]


# -- the site ---------------------------------------------------------------------------


def test_the_site_builds_strictly_with_its_generated_pages(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKLIFT_")}
    env["NO_MKDOCS_2_WARNING"] = "1"  # Material's notice about MkDocs 2, not a warning
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    _top, *below = reference.walk(build_parser())
    for command in below:
        assert f'id="{reference.anchor(command.name)}"' in cli, command.name
    metrics = (site / "reference" / "metrics" / "index.html").read_text(encoding="utf-8")
    assert "forklift_jobs_total" in metrics and "forklift_queue_depth" in metrics
    schema = (site / "reference" / "schema" / "index.html").read_text(encoding="utf-8")
    assert "0001 initial" in schema and "jobs_lease_when_running" in schema
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "enqueue_many" in api and "wait_cancelled" in api


def test_the_cli_reference_has_every_flag_of_every_command() -> None:
    parser = build_parser()
    page = reference.page(parser)
    common = page.split("Every command also takes:", 1)[1].split("\n#", 1)[0]
    for name, p in reference.commands(parser):
        start = page.index(f"{{#{reference.anchor(name)}}}")
        end = page.find("{#forklift-", start + 1)
        section = page[start : end if end != -1 else len(page)]
        for action in p._actions:
            flags = [f for f in action.option_strings if f.startswith("--") and f != "--help"]
            for flag in flags:
                assert flag in section or f"`{flag}`" in common, f"forklift {name}: {flag}"
    assert "| `--workers` |" in page, "the table of every flag"


def test_the_api_page_names_members_that_exist() -> None:
    """A member listed for an object of the API page exists (mkdocstrings would leave a
    renamed one out without a word)."""
    text = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    for target, listed in re.findall(r"::: ([\w.]+)\n(?:    .*\n)*?\s+members: \[([^\]]*)\]", text):
        obj = importlib.import_module(target.rpartition(".")[0])
        obj = getattr(obj, target.rpartition(".")[2])
        for member in (m.strip() for m in listed.split(",")):
            assert hasattr(obj, member), f"{target}.{member} is on the API page only"


# -- README -----------------------------------------------------------------------------


def test_the_readme_stays_small() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes: move detail into docs/"


def _links(path: Path) -> Iterator[tuple[str, str]]:
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text(encoding="utf-8")):
        if "://" not in target and not target.startswith(("#", "mailto:")):
            file, _, anchor = target.partition("#")
            yield file, anchor


def _slugs(path: Path) -> set[str]:
    """The anchors of a page's headings, as MkDocs and GitHub make them."""
    slugs = set()
    for heading in re.findall(r"(?m)^#+ (.+)$", path.read_text(encoding="utf-8")):
        text = re.sub(r"[^\w\- ]", "", heading.split("{#")[0].strip().lower())
        slugs.add(re.sub(r"[\s]+", "-", text.strip()))
    return slugs


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md", "bench/README.md"])
def test_the_links_of_the_pages_outside_the_site_resolve(name: str) -> None:
    page = ROOT / name
    for file, anchor in _links(page):
        target = (page.parent / file).resolve()
        assert target.exists(), f"{name} links to {file}, which does not exist"
        if anchor:
            assert anchor in _slugs(target), f"{name} links to {file}#{anchor}: no such heading"


def test_the_readme_quickstart_blocks_stay_marked() -> None:
    text = README.read_text(encoding="utf-8")
    marked = re.findall(r"<!-- quickstart:([\w.]+) -->\n```(\w+)\n", text)
    assert marked == [("mymodule.py", "python"), ("terminal", "sh"), ("terminal", "sh")]


# -- Python examples --------------------------------------------------------------------


def _names_of_forklift(tree: ast.AST) -> set[str]:
    """Every NAME of `forklift.NAME` an example uses."""
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "forklift"
    }


def test_every_python_example_compiles_and_names_what_forklift_has() -> None:
    found = blocks("python", "py")
    assert found, "no Python examples found"
    for block in found:
        flags = ast.PyCF_ONLY_AST | (ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if block.fragment else 0)
        try:
            tree = compile(block.code, block.where, "exec", flags=flags, dont_inherit=True)
        except SyntaxError as exc:
            pytest.fail(f"{block.where}: does not compile: {exc}")
        for name in sorted(_names_of_forklift(tree)):
            if not hasattr(forklift, name):
                importlib.import_module(f"forklift.{name}")  # a module: forklift.testing


RUNNER = """
import json, sys, traceback
failed = []
for where, code in json.load(sys.stdin):
    try:
        exec(compile(code, where, "exec"), {"__name__": "docs_example"})
    except BaseException:
        failed.append(where + ": " + traceback.format_exc(limit=-3))
print(json.dumps(failed))
"""


def test_every_python_example_not_marked_a_fragment_runs(tmp_path: Path) -> None:
    """Each in a namespace of its own, in one process, with a database URL nothing
    answers (an example that needs a database must be marked a fragment) and the
    development database off."""
    runnable = [(b.where, b.code) for b in blocks("python", "py") if not b.fragment]
    assert runnable, "no runnable Python examples found"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKLIFT_")}
    env |= {
        "FORKLIFT_DATABASE_URL": "postgresql://127.0.0.1:1/docs_examples",
        "FORKLIFT_DEVDB": "off",
        "PYTHONPATH": str(ROOT),
    }
    ran = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(runnable),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    failed = json.loads(ran.stdout)
    assert failed == [], f"mark an example that cannot run alone {FRAGMENT}:\n" + "\n".join(failed)


# -- shell examples ---------------------------------------------------------------------


def command_lines(block: Block) -> Iterator[tuple[int, str]]:
    """The command lines of a shell block, by line number: every line of `sh`, the `$ `
    lines of `console`; continuation lines joined."""
    pending, first = "", 0
    for n, raw in enumerate(block.code.splitlines(), block.line):
        line = raw
        if block.lang == "console" and not pending:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        first = first if pending else n
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield first, pending + line
        pending = ""


def forklift_argv(line: str) -> list[str] | None:
    """The arguments of a `forklift` (or `.venv/bin/forklift`) command line, up to its
    first shell operator, without the variables set before it; None for other lines."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    words = []
    for word in lex:
        if word in OPERATORS:
            break
        words.append(word)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words.pop(0)
    if not words or not (words[0] == "forklift" or words[0].endswith("/forklift")):
        return None
    return words[1:]


def test_every_forklift_command_in_a_shell_example_parses() -> None:
    parser = build_parser()
    for command in reference.walk(parser):
        command.parser.allow_abbrev = False  # a page spells a flag out, as --help does
    checked, failures = 0, []
    for block in blocks(*SHELLS):
        for n, line in command_lines(block):
            argv = forklift_argv(line)
            if argv is None:
                continue
            checked += 1
            said = io.StringIO()
            try:
                with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
                    parser.parse_args(argv)
            except SystemExit as exc:
                if exc.code not in (0, None):
                    where = f"{block.path.relative_to(ROOT)}:{n}"
                    failures.append(f"{where}: {line.strip()}\n  {said.getvalue().strip()}")
    assert checked, "no forklift command lines found"
    assert failures == [], "\n".join(failures)


def test_shell_lines_are_read_as_a_shell_reads_them() -> None:
    assert forklift_argv("FORKLIFT_X=1 forklift status --json | jq .  # a comment") == [
        "status",
        "--json",
    ]
    assert forklift_argv(".venv/bin/forklift run a:app --workers 2 && echo") == [
        "run",
        "a:app",
        "--workers",
        "2",
    ]
    assert forklift_argv("python -c 'import forklift'") is None


# -- the design page --------------------------------------------------------------------


def cited_invariants(text: str) -> set[int]:
    """The invariant numbers a text cites: "invariant 20", "invariants 3 and 14"."""
    found: set[int] = set()
    for group in re.findall(r"(?i)\binvariants?\s+(\d+(?:\s*(?:,|and|&)\s*\d+)*)", text):
        found.update(int(n) for n in re.findall(r"\d+", group))
    return found


def design_invariants() -> list[int]:
    """The numbers of the design page's invariants list, in order."""
    text = (DOCS / "design.md").read_text(encoding="utf-8")
    section = text.split("\n## Invariants\n", 1)[1].split("\n## ", 1)[0]
    return [int(n) for n in re.findall(r"(?m)^(\d+)\. ", section)]


def test_every_invariant_the_code_cites_is_on_the_design_page() -> None:
    listed = design_invariants()
    assert listed == list(range(1, len(listed) + 1)), "numbered 1, 2, 3, ... without a gap"
    assert cited_invariants("as DESIGN invariant 20 says; invariants 3 and 14") == {3, 14, 20}
    missing = []
    for top in ("forklift", "tests"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in (".py", ".sql", ".md", ".txt") and "__pycache__" not in path.parts:
                text = path.read_text(encoding="utf-8", errors="replace")
                for n in sorted(cited_invariants(text) - set(listed)):
                    missing.append(f"{path.relative_to(ROOT)} cites invariant {n}")
    assert missing == [], "not on docs/design.md:\n" + "\n".join(missing)


def test_the_design_page_has_a_row_for_each_death_authority() -> None:
    from forklift.supervisor.deaths import AUTHORITY

    text = (DOCS / "design.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")}
    assert [a.who for a in AUTHORITY if a.who not in rows] == []
