"""Dependencies point down: the parts of the package that others build on import nothing
from the parts built on them (at any depth: in functions and for type checking too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each part, and the parts above it that it must not import. The CLI and the dashboard
# both show what forklift.shown words; both read through forklift.admin; the operator's
# side (admin) and the producer's (batch) use the stores.
ABOVE = {
    "forklift.dashboard": ("forklift.cli",),
    "forklift.shown": ("forklift.cli", "forklift.dashboard"),
    "forklift.admin": ("forklift.cli", "forklift.dashboard", "forklift.shown"),
    "forklift.batch": ("forklift.admin", "forklift.cli", "forklift.dashboard"),
    "forklift.store": ("forklift.admin", "forklift.cli", "forklift.dashboard", "forklift.shown"),
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(path: Path) -> set[str]:
    """Every module name an import statement of `path` names, wherever it stands."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def _within(name: str, part: str) -> bool:
    return name == part or name.startswith(part + ".")


@pytest.mark.parametrize("part", sorted(ABOVE))
def test_a_part_imports_nothing_from_the_parts_above_it(part: str) -> None:
    paths = sorted((ROOT / "forklift").rglob("*.py"))
    upward = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in paths
        if _within(_module(path), part)
        for name in sorted(_imported(path))
        if any(_within(name, above) for above in ABOVE[part])
    ]
    assert upward == []
