"""The import graph of the code (tests/import_graph.py, read with ``ast``):
no circle among the modules of infra/, trainer/, tfcluster_cli/ and
deploy.py, counting imports under ``TYPE_CHECKING`` and inside functions;
and the library below the command lines.

A circle is removed by moving the shared piece down (a small module, a
protocol of what one side asks of the other, a value passed in), never by
hiding the import."""

from __future__ import annotations

import ast
import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from tests.import_graph import REPO, cycles, graph, imports, module_name, modules
from trainer import catalog

PRODUCT = ("infra", "trainer", "tfcluster_cli")


def _product_graph() -> dict[str, dict[str, int]]:
    paths = [p for folder in PRODUCT for p in modules(folder)] + [REPO / "deploy.py"]
    return graph(paths)


def _show(edges: dict[str, dict[str, int]], circle: list[str]) -> str:
    return (
        " -> ".join(f"{a} (line {edges[a][b]})" for a, b in itertools.pairwise(circle))
        + f" -> {circle[-1]}"
    )


def test_no_import_circle() -> None:
    edges = _product_graph()
    found = [_show(edges, c) for c in cycles(edges)]
    assert found == [], "import circles:\n" + "\n".join(found)


def test_the_graph_is_the_whole_product() -> None:
    """The reader finds the modules and their imports at all (else the test
    above passes on nothing)."""
    edges = _product_graph()
    assert len(edges) > 100
    assert "infra.cluster.base" in edges["infra.cluster.api"]
    assert "trainer.catalog" in edges["infra.config.schema"]
    assert "infra.cluster.api" in edges["deploy"] or any(
        n.startswith("tfcluster_cli") for n in edges["deploy"]
    )


def test_the_cycle_finder_finds_circles_and_only_circles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    # Two circles, one through a module both share, and a tail that is not part of them.
    found = cycles({"x": {"y"}, "y": {"x", "z"}, "z": {"w"}, "w": {"z"}, "v": {"x"}})
    assert found == [["w", "z", "w"], ["x", "y", "x"]]
    # The shortest way round, not merely the first found.
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": {"a"}}) == [["a", "c", "a"]]


def test_a_package_import_counts_its_parents() -> None:
    """``import infra.providers.gce.checks`` runs infra/providers/__init__.py
    and infra/providers/gce/__init__.py first: edges to both; a module's own
    packages are no edge (they are running already)."""
    edges = graph([*modules("infra/providers"), REPO / "infra" / "cluster" / "base.py"])
    assert {"infra.providers", "infra.providers.base"} <= set(edges["infra.cluster.base"])
    assert "infra.providers" not in edges["infra.providers.local"]
    assert "infra.providers.base" in edges["infra.providers.gce.provider"]
    assert "infra.providers" not in edges["infra.providers.gce.provider"]


def test_the_library_never_imports_the_command_lines() -> None:
    """infra/ and trainer/ are used from a notebook as from the CLI: no
    click, no tfcluster_cli, no deploy.py."""
    found = [
        f"{path.relative_to(REPO)} imports {name}"
        for folder in ("infra", "trainer")
        for path in modules(folder)
        for name in sorted(imports(path))
        if name.split(".")[0] in ("click", "tfcluster_cli", "deploy")
    ]
    assert found == []


# -- the trainer's catalog: the one place modes and models differ ---------------

# Where a mode or model may be named in a comparison: the catalog and the
# modules that implement them. bench/ picks the modes it measures by name
# (what a benchmark compares is its own choice) and is not scanned.
NAMES_MAY_BE_COMPARED = ("trainer/catalog.py", "trainer/modes/", "trainer/models/")


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for element in node.elts for s in _strings(element)]
    return []


def name_comparisons(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, comparison) for each comparison in ``source`` with one of
    ``names`` as a literal (``x == "sync"``, ``m not in ("a", "b")``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(s in names for side in sides for s in _strings(side)):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_name_scan_sees_comparisons() -> None:
    source = (
        'if args.mode != "ensemble": pass\n'
        'ok = mode in ("sync", "average")\n'
        'label = "sync"\n'  # a value, not a comparison
        'other = kind == "ssh"\n'
    )
    names = {"ensemble", "sync", "average"}
    assert [line for line, _ in name_comparisons(source, names)] == [1, 2]


def test_modes_and_models_are_compared_only_in_the_catalog() -> None:
    names = set(catalog.MODE_NAMES) | set(catalog.MODELS)
    paths = [p for folder in PRODUCT for p in modules(folder)] + [REPO / "deploy.py"]
    found = [
        f"{rel}:{line}: {text}"
        for path in paths
        if not (rel := path.relative_to(REPO).as_posix()).startswith(NAMES_MAY_BE_COMPARED)
        for line, text in name_comparisons(path.read_text(encoding="utf-8"), names)
    ]
    assert found == [], "ask trainer/catalog.py (a field of the Mode or Model) instead:\n" + (
        "\n".join(found)
    )


def test_the_catalog_entries_name_their_fields() -> None:
    """``Model("cnn", module=..., learning_rate=...)``: the name, then
    keywords, so that an entry reads without the dataclass beside it."""
    tree = ast.parse((REPO / "trainer" / "catalog.py").read_text(encoding="utf-8"))
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Model"
    ]
    assert len(calls) == len(catalog.MODELS)
    assert [ast.unparse(c)[:60] for c in calls if len(c.args) > 1] == []


def test_the_defaults_are_in_the_catalog() -> None:
    assert catalog.mode(catalog.DEFAULT_MODE).one_process
    assert catalog.DEFAULT_MODEL in catalog.MODELS
    assert catalog.DEFAULT_MODE in [m for m in catalog.MODE_NAMES if catalog.one_process(m)]
    assert not catalog.one_process("sync")
    assert not catalog.one_process("no-such-mode") and not catalog.one_process(None)


# -- folders that are layers ----------------------------------------------------

# Each package's rooms, lowest first: a module imports only from its own room
# or from rooms below it. A room is a folder or a top-level module; each
# folder's docstring (its __init__.py) says what it owns and what it may
# import. A new folder takes its place here, or the test below fails.
LAYERS = {
    "infra": [
        ("infra.errors", "infra.text"),
        ("infra.spec",),
        ("infra.storage",),
        ("infra.config",),
        ("infra.state",),
        ("infra.transport",),
        ("infra.node",),
        ("infra.bucket",),
        ("infra.providers",),
        ("infra.setup",),
        ("infra.jobs",),
        ("infra.cluster",),
        ("infra.sweeps",),
        ("infra.reports",),
    ],
    "trainer": [
        ("trainer.errors", "trainer.options", "trainer.imports"),
        ("trainer.layers",),
        ("trainer.catalog", "trainer.flags"),
        ("trainer.data",),
        ("trainer.models",),
        ("trainer.loop",),
        ("trainer.distribution",),
        ("trainer.modes",),
        ("trainer.training", "trainer.run", "trainer.__main__"),
    ],
}
MAX_MODULES_PER_FOLDER = 13


def layer_of(module: str, layers: Sequence[tuple[str, ...]]) -> int | None:
    for index, rooms in enumerate(layers):
        if any(module == room or module.startswith(room + ".") for room in rooms):
            return index
    return None


def upward_imports(
    edges: Mapping[str, Mapping[str, int]], layers: Sequence[tuple[str, ...]]
) -> list[str]:
    found = []
    for module, targets in edges.items():
        here = layer_of(module, layers)
        for target, line in targets.items():
            there = layer_of(target, layers)
            if here is not None and there is not None and there > here:
                found.append(f"{module} (line {line}) imports {target}, a higher layer")
    return sorted(found)


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_the_layers_import_only_downwards(package: str) -> None:
    edges = graph(modules(package))
    assert upward_imports(edges, LAYERS[package]) == []


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_every_room_is_a_layer(package: str) -> None:
    """Every module of the package has its place in the order (a new
    folder or top-level module is placed on purpose), and every room
    named exists."""
    names = {module_name(p) for p in modules(package)} - {package}
    assert [n for n in sorted(names) if layer_of(n, LAYERS[package]) is None] == []
    rooms = [room for rooms in LAYERS[package] for room in rooms]
    assert [room for room in rooms if room not in names] == []


def test_the_layer_check_finds_an_upward_import() -> None:
    layers = [("a.low",), ("a.mid",), ("a.high",)]
    edges = {"a.low.x": {"a.high.y": 3}, "a.mid.z": {"a.low.x": 1}, "a.high.y": {}}
    assert upward_imports(edges, layers) == ["a.low.x (line 3) imports a.high.y, a higher layer"]


def _folders() -> list[Path]:
    return sorted(
        init.parent
        for package in LAYERS
        for init in (REPO / package).rglob("__init__.py")
        if "__pycache__" not in init.parts
    )


@pytest.mark.parametrize("folder", _folders(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_each_folder_says_what_it_owns_and_stays_small(folder: Path) -> None:
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8")))
    assert doc and len(doc.split()) >= 15, f"{folder}: say what this folder owns"
    own = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
    assert len(own) <= MAX_MODULES_PER_FOLDER, f"{folder}: {len(own)} modules; split it in rooms"


# -- sizes ----------------------------------------------------------------------

# A module a reader holds in mind at once, a function a reader sees on one
# screen. A function's size runs from its ``def`` to its last line
# (``end_lineno - lineno + 1``): its decorators are not counted, its
# docstring is.
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def oversized(path: Path) -> list[str]:
    """``path``'s module if it is over MAX_MODULE_LINES and each function or
    method in it over MAX_FUNCTION_LINES, with their sizes."""
    source = path.read_text(encoding="utf-8")
    rel = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{rel}: {lines} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if size > MAX_FUNCTION_LINES:
                found.append(
                    f"{rel}:{node.lineno}: {node.name} {size} lines (at most {MAX_FUNCTION_LINES})"
                )
    return found


def test_the_size_check_finds_a_long_module_and_a_long_function(tmp_path: Path) -> None:
    short = "def f():\n" + "    x = 1\n" * (MAX_FUNCTION_LINES - 1)
    long = "@decorator\ndef g():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    filler = "\n" * (MAX_MODULE_LINES - short.count("\n") - long.count("\n") + 1)
    path = tmp_path / "m.py"
    path.write_text(short + long + filler)
    assert oversized(path) == [
        f"{path}: {MAX_MODULE_LINES + 1} lines (at most {MAX_MODULE_LINES})",
        f"{path}:{MAX_FUNCTION_LINES + 2}: g {MAX_FUNCTION_LINES + 1} lines"
        f" (at most {MAX_FUNCTION_LINES})",
    ]
    path.write_text(short)
    assert oversized(path) == []


def test_no_module_or_function_is_too_long() -> None:
    paths = [p for folder in PRODUCT for p in modules(folder)] + [REPO / "deploy.py"]
    found = [line for path in paths for line in oversized(path)]
    assert found == [], "split by concept:\n" + "\n".join(found)
