"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The offline MNIST copy beside the checkout (CI), unless the caller set one.
DEFAULT_MNIST = REPO.parent / "shared" / "datasets" / "mnist"


@pytest.fixture(autouse=True)
def tfcluster_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own state folder: no test sees another's keys,
    known hosts or clusters, and none touches the user's ~/.tfcluster."""
    home = tmp_path_factory.mktemp("tfcluster-home")
    monkeypatch.setenv("TFCLUSTER_HOME", str(home))
    yield home


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    path = Path(os.environ.get("MNIST_DIR") or DEFAULT_MNIST).resolve()
    if not (path / "train-images-idx3-ubyte.gz").exists():
        pytest.fail(f"MNIST not found at {path}: set MNIST_DIR to a folder of the official files")
    return path
