"""The code's shape: small classes and functions, no mixins, no import cycles.

These are the limits the codebase keeps (see STYLE.md); a change that breaks one must
split what grew, not raise the limit.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("forklift", "bench", "tests", "examples")
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 60


def _modules(*roots: str) -> Iterator[tuple[Path, ast.Module]]:
    for root in roots:
        for path in sorted((ROOT / root).rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _length(node: ast.AST) -> int:
    assert isinstance(node, ast.stmt) and node.end_lineno is not None
    decorators: list[ast.expr] = getattr(node, "decorator_list", [])
    first = min([node.lineno, *(d.lineno for d in decorators)])
    return node.end_lineno - first + 1


def test_no_function_is_longer_than_the_limit() -> None:
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({_length(node)} lines)"
        for path, tree in _modules(*CHECKED)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and _length(node) > MAX_FUNCTION_LINES
    ]
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: split them"


def test_no_class_is_longer_than_the_limit() -> None:
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({_length(node)} lines)"
        for path, tree in _modules(*CHECKED)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and _length(node) > MAX_CLASS_LINES
    ]
    assert long == [], f"classes over {MAX_CLASS_LINES} lines: split them"


def test_no_class_of_the_package_inherits_from_two_of_its_own() -> None:
    """No mixins: collaborators are passed in, not inherited with undeclared state."""
    found = []
    for path, tree in _modules("forklift"):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                own = [b for b in node.bases if not _is_library_base(b)]
                if len(own) > 1 or node.name.endswith("Mixin"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert found == []


def _is_library_base(base: ast.expr) -> bool:
    name = ast.unparse(base)
    library = (
        "Exception", "ValueError", "LookupError", "AssertionError", "Generic", "StrEnum",
        "IntEnum", "Enum", "NamedTuple", "Protocol", "Collector", "HTTPServer",
        "BaseHTTPRequestHandler", "ThreadingHTTPServer",
    )  # fmt: skip
    return name.split("[")[0].split(".")[-1] in library


def _imports_of(path: Path, tree: ast.Module) -> set[str]:
    """forklift modules `path` imports at module level (TYPE_CHECKING blocks excluded)."""
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("forklift"))
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("forklift")
        ):
            assert node.module is not None
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_the_package_has_no_import_cycle() -> None:
    modules = {_module_name(p): t for p, t in _modules("forklift")}
    paths = {_module_name(p): p for p, _ in _modules("forklift")}
    graph = {
        name: {m for m in _imports_of(paths[name], tree) if m in modules and m != name}
        for name, tree in modules.items()
    }
    # A package's __init__ re-exporting its modules is not a cycle with them.
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


@pytest.mark.parametrize("path", sorted((ROOT / "forklift").rglob("*.py")), ids=str)
def test_every_module_starts_with_a_docstring(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert ast.get_docstring(tree), f"{path.relative_to(ROOT)} has no module docstring"
