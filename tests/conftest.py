"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# A session started in the background of a shell without job control (`cmd &`
# in a script, nohup) inherits SIGINT ignored, and so does every process it
# starts: the tests of Ctrl-C (a signal sent to a deploy.py, or raised here)
# would test nothing. They need SIGINT as a terminal delivers it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parents[1]
# Where a job's results come home when no --dest is given: runs/<cluster>/...
# of the current folder (infra/cluster/jobs.py), which tests must never fill.
REPO_RUNS = REPO / "runs"
# The offline MNIST copy beside the checkout (CI), unless the caller set one.
DEFAULT_MNIST = REPO.parent / "shared" / "datasets" / "mnist"


@pytest.fixture(autouse=True)
def tfcluster_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own state folder: no test sees another's keys,
    known hosts or clusters, and none touches the user's ~/.tfcluster.
    Afterwards the network namespaces its local clusters made are ended,
    as `down` would (tests rarely say `down`)."""
    home = tmp_path_factory.mktemp("tfcluster-home")
    monkeypatch.setenv("TFCLUSTER_HOME", str(home))
    yield home
    end_namespaces(home)


def end_namespaces(folder: Path) -> None:
    """End the holder of every local cluster's network namespace recorded
    in a state folder below ``folder`` (infra/providers/local_network.py)."""
    from infra.providers.local_network import TaskNetwork

    for record in folder.glob("**/clusters/*/netns"):
        TaskNetwork(record.parent, sys.executable).end()


@pytest.fixture(scope="session", autouse=True)
def no_namespace_left(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Module-scoped fixtures keep state folders of their own: what their
    clusters made is ended when the session ends."""
    yield
    end_namespaces(tmp_path_factory.getbasetemp())


def _entries(folder: Path) -> set[Path]:
    return set(folder.rglob("*")) if folder.is_dir() else set()


@pytest.fixture(scope="session", autouse=True)
def checkout_runs_untouched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The session fails if anything new lands in the checkout's runs/.
    It runs in a tmp folder too: module-scoped fixtures (a job several
    tests look at) are set up before any test's own folder."""
    before = _entries(REPO_RUNS)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("session-cwd"))
        yield
    # runs/<cluster>/<run id>: the run folders, not every file in them.
    new = {p for p in _entries(REPO_RUNS) - before if len(p.relative_to(REPO_RUNS).parts) <= 2}
    if shown := sorted(str(p.relative_to(REPO)) for p in new if not any(q.parent == p for q in new)):
        pytest.fail(
            # `make test` runs two sessions at once (scripts/test_streams.py):
            # each sees what either wrote.
            f"this session, or one beside it, wrote into the checkout: {', '.join(shown)}; "
            "give the test that did --dest or a tmp folder, and delete them"
        )


@pytest.fixture(autouse=True)
def cwd_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test runs in a folder of its own: a job without --dest brings
    its results home to runs/ there, and the local cluster's default working
    folder (the current one) is empty rather than the checkout."""
    folder = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(folder)
    return folder


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    path = Path(os.environ.get("MNIST_DIR") or DEFAULT_MNIST).resolve()
    if not (path / "train-images-idx3-ubyte.gz").exists():
        pytest.fail(f"MNIST not found at {path}: set MNIST_DIR to a folder of the official files")
    return path
