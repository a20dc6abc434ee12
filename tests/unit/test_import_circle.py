"""The public API's modules import downwards: none of them imports, even lazily or for its
types alone, a module that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

import forklift

PUBLIC = (
    "forklift.app", "forklift.batch", "forklift.task", "forklift.scheduler.declare",
    "forklift._producing", "forklift._tracing", "forklift.workers.context",
)  # fmt: skip


def imports() -> dict[str, set[str]]:
    """Each forklift module's imports of forklift modules, wherever written: at the top, in
    a function, or for type checkers. `from forklift import _db` imports forklift._db."""
    root = Path(forklift.__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    found: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                subs = [f"{base}.{a.name}" for a in node.names]
                names = [s for s in subs if s in modules] or [base]
            else:
                continue
            found[module] |= {n for n in names if n in modules and n != module}
    return found


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return seen


def test_no_public_api_module_is_on_an_import_circle() -> None:
    graph = imports()
    assert set(PUBLIC) <= set(graph)
    circled = {m: sorted(n for n in reach(graph, m) if m in reach(graph, n)) for m in PUBLIC}
    assert {m: on for m, on in circled.items() if on} == {}
