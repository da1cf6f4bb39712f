"""docs/architecture.md stays true: every repo path it names exists, and
the import rules it states hold (each module's imports read with ``ast``,
nothing imported: fast, no TensorFlow).

When a rule fails, move the code rather than the rule: the rules are what
keep the local cluster free of Google's client, the CLI replaceable, and the
nodes' copy of ``trainer/`` complete on its own."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.import_graph import REPO, imports, module_name
from tests.import_graph import modules as _modules

DOC = REPO / "docs" / "architecture.md"

# What infra imports from the trainer: its catalog, its progress protocol
# and (infra/sweeps/run.py, for the names of swept flags) its argparse flags.
# All three are plain Python; test_infra_reads_no_tensorflow_through_the_trainer
# keeps them so.
INFRA_MAY_IMPORT_FROM_TRAINER = {"trainer.catalog", "trainer.loop.progress", "trainer.flags"}
TENSORFLOW = ("tensorflow", "keras")


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(folder: str, bad: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(REPO)} imports {name}"
        for path in _modules(folder)
        for name in sorted(imports(path))
        if any(_under(name, b) for b in bad)
    ]


# -- the paths the document names ---------------------------------------------


def doc_paths() -> Iterator[str]:
    """Spans in backticks that look like a path of this repository: no
    spaces or placeholders (``trainer/models/<name>.py``), and a "/" or a
    ".py" ending. Code blocks are sketches, not checked."""
    text = re.sub(r"^```.*?^```", "", DOC.read_text(encoding="utf-8"), flags=re.S | re.M)
    for span in re.findall(r"`([^`\n]+)`", text):
        looks_like_path = "/" in span or span.endswith(".py")
        if re.fullmatch(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-/]*", span) and looks_like_path:
            yield span.rstrip("/")


def test_the_document_names_paths_at_all() -> None:
    assert len(set(doc_paths())) > 30


@pytest.mark.parametrize("path", sorted(set(doc_paths())))
def test_every_path_in_the_document_exists(path: str) -> None:
    assert (REPO / path).exists(), f"docs/architecture.md names `{path}`, which does not exist"


def test_the_readme_links_the_document() -> None:
    assert "(docs/architecture.md)" in (REPO / "README.md").read_text(encoding="utf-8")


# -- the import rules -----------------------------------------------------------


def test_infra_and_trainer_never_import_click() -> None:
    assert violations("infra", ("click",)) == []
    assert violations("trainer", ("click",)) == []


def test_infra_never_imports_tensorflow() -> None:
    assert violations("infra", TENSORFLOW) == []


def test_only_the_gce_storage_and_bucket_packages_import_google() -> None:
    # The product: the library, the trainer, the CLI and the examples.
    # (Tests drive the real clients, and bench/up.py loads one before timing.)
    allowed = [REPO / "infra" / name for name in ("providers/gce", "storage", "bucket")]
    found = [
        v
        for folder in ("infra", "trainer", "examples")
        for v in violations(folder, ("google",))
        if not any((REPO / v.split(" ")[0]).is_relative_to(folder) for folder in allowed)
    ]
    found += [f"deploy.py imports {n}" for n in imports(REPO / "deploy.py") if _under(n, "google")]
    assert found == []
    # Each its own service: Compute in gce/, Cloud Storage in storage/.
    assert violations("infra/providers/gce", ("google.cloud.storage",)) == []
    assert violations("infra/storage", ("google.cloud.compute_v1",)) == []
    assert violations("infra/bucket", ("google.cloud.compute_v1",)) == []


def test_the_nodes_storage_code_needs_nothing_but_itself() -> None:
    """infra/storage/ goes to the nodes (CODE_PATHS), which have no
    pydantic and no rest of infra: the uploader and what it imports stay
    within the package's node-safe modules and Google's client."""
    paths = _modules("infra/storage")
    node_safe = {"infra", *(module_name(p) for p in paths)}
    assert {"infra.storage.uploader", "infra.storage.transfer"} <= node_safe
    for path in paths:
        for imported in imports(path):
            if _under(imported, "infra"):
                assert imported in node_safe, f"{path.name} imports {imported}"
            assert not _under(imported, "pydantic") and not _under(imported, "yaml"), imported


def test_infra_imports_from_the_trainer_only_what_it_may() -> None:
    found = {
        name for path in _modules("infra") for name in imports(path) if _under(name, "trainer")
    }
    # `from trainer import catalog` is trainer.catalog; a bare `trainer` would
    # be the package itself, which the rule does not allow either.
    assert found <= INFRA_MAY_IMPORT_FROM_TRAINER, found - INFRA_MAY_IMPORT_FROM_TRAINER


def test_infra_reads_no_tensorflow_through_the_trainer() -> None:
    """What infra may import from the trainer imports, through the trainer's
    own modules, nothing of TensorFlow's."""
    seen: set[str] = set()
    todo = list(INFRA_MAY_IMPORT_FROM_TRAINER)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        base = REPO.joinpath(*name.split("."))
        path = (
            base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        )
        for imported in imports(path):
            assert not any(_under(imported, t) for t in TENSORFLOW), f"{name} imports {imported}"
            if _under(imported, "trainer"):
                todo.append(imported)


def test_the_trainer_never_imports_infra() -> None:
    """Only trainer/ is synced to the nodes (infra/setup/sync.py's CODE_PATHS)."""
    assert violations("trainer", ("infra", "deploy")) == []


def test_benchmarks_never_import_tests() -> None:
    assert violations("bench", ("tests",)) == []


def test_the_import_reader_sees_lazy_and_submodule_imports() -> None:
    """The rules above are only as good as ``imports``."""
    here = REPO / "infra" / "providers" / "gce" / "provider.py"
    names = imports(here)
    assert "infra.transport.ssh" in names  # imported inside a method
    assert "infra.providers.gce.checks" in names  # `from infra.providers.gce import checks`
    assert "trainer.catalog" in imports(REPO / "infra" / "config" / "schema.py")


# -- the module paths named elsewhere ------------------------------------------

# Where the checkout names its own modules by path for a reader (docs,
# comments, scripts, make and docker files). docs/architecture.md has its
# own test above (its recipes name files a reader would add).
NAMING = (
    "README.md",
    "Dockerfile",
    "Makefile",
    "deploy.py",
    "pyproject.toml",
    "docker-compose.yml",
)
NAMING_FOLDERS = (
    "docker",
    "mk",
    "scripts",
    "bench",
    "examples",
    "infra",
    "trainer",
    "tfcluster_cli",
)
MODULE_PATH = re.compile(r"(?<![\w/.])((?:infra|trainer|tfcluster_cli)/[\w/]*\.py)\b")


def named_module_paths() -> Iterator[tuple[str, str]]:
    files = [REPO / name for name in NAMING]
    for folder in NAMING_FOLDERS:
        files += [p for p in sorted((REPO / folder).rglob("*")) if p.is_file()]
    for path in files:
        if "__pycache__" in path.parts or path.suffix in (".pyc", ".gz"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for found in MODULE_PATH.findall(text):
            yield str(path.relative_to(REPO)), found


def test_every_module_path_named_in_the_checkout_exists() -> None:
    """After a move (infra/ and trainer/ into rooms), a comment or a doc that
    still names the old file sends the reader nowhere."""
    named = list(named_module_paths())
    assert len(named) > 50  # the reader finds them at all
    missing = sorted(
        {f"{where} names {path}" for where, path in named if not (REPO / path).exists()}
    )
    assert missing == []
