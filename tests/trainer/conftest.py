"""Fixtures of the trainer tests: local jobs that are always cleaned up."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.trainer.cluster import LocalJob

StartJob = Callable[..., LocalJob]


@pytest.fixture
def start_job(tmp_path: Path, mnist_dir: Path) -> Iterator[StartJob]:
    """``start_job(mode, argv, workers=, ps=, name=, cpus=)``: a running job of real
    trainer processes on loopback, reading the offline MNIST. Every process
    is killed at teardown, whether the test passed or not."""
    jobs: list[LocalJob] = []

    def start(
        mode: str,
        argv: Sequence[str],
        *,
        workers: int = 1,
        ps: int = 0,
        name: str = "job",
        cpus: dict[str, set[int]] | None = None,
    ) -> LocalJob:
        job = LocalJob(
            mode=mode,
            argv=list(argv),
            log_dir=tmp_path / f"{name}-logs",
            workers=workers,
            ps=ps,
            env={"MNIST_DIR": str(mnist_dir)},
            cpus=cpus or {},
        )
        jobs.append(job)
        return job.start()

    try:
        yield start
    finally:
        for job in jobs:
            job.stop()
