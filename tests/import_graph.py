"""The repository's imports, read with ``ast`` (nothing imported: fast, no
TensorFlow): what each module imports, anywhere in it (a function's lazy
import and one under ``TYPE_CHECKING`` count too: hiding a circle is not
removing it), and the circles among them.

tests/test_architecture_doc.py checks the document's import rules with it,
tests/test_architecture.py that the code has no circle."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def modules(folder: str) -> list[Path]:
    return sorted(p for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    base = REPO.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def import_lines(path: Path) -> dict[str, int]:
    """Every module ``path`` imports, with the line of its first import:
    ``from a import b`` is ``a.b`` where ``b`` is a module of this
    repository, else ``a``."""
    found: dict[str, int] = {}
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                names.append(full if is_module(full) else base)
        for imported in names:
            found[imported] = min(found.get(imported, node.lineno), node.lineno)
    return found


def imports(path: Path) -> set[str]:
    return set(import_lines(path))


def graph(paths: Iterable[Path]) -> dict[str, dict[str, int]]:
    """Module -> the modules among ``paths`` it imports (with the line).
    Importing ``a.b.c`` runs the packages ``a`` and ``a.b`` first: those
    count too, except the importer's own packages (already running)."""
    by_name = {module_name(p): p for p in paths}
    edges: dict[str, dict[str, int]] = {}
    for name, path in by_name.items():
        own = _packages(name)
        out: dict[str, int] = {}
        for imported, line in import_lines(path).items():
            for target in [imported, *sorted(_packages(imported) - own)]:
                if target in by_name and target != name:
                    out.setdefault(target, line)
        edges[name] = out
    return edges


def _packages(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One circle of each strongly connected group of modules (Tarjan's
    algorithm, iterative), as [a, b, ..., a], sorted: empty when the
    imports only go one way."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return sorted(_circle(edges, group) for group in groups)


def _circle(edges: Mapping[str, Iterable[str]], group: set[str]) -> list[str]:
    """The shortest way from the group's first module back to itself."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges.get(node, ())):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if child in group and child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{sorted(group)} is not a circle")
