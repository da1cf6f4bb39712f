"""What a job's life asks of its cluster (``JobCluster``): the steps
``infra/jobs/run.py`` and ``infra/jobs/recovery.py`` are made of.

A protocol, not the class: ``Cluster`` (infra/cluster/api.py) offers these and
calls ``run_job`` for `train` and `run`, so the job's life reads its cluster
through this page and imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from infra.bucket.commands import BucketOutcome
from infra.config.loader import ClusterConfig
from infra.jobs.job import Job
from infra.jobs.progress import ProgressEvent
from infra.jobs.readiness import Waiting
from infra.providers.base import Node, NodeProvider
from infra.setup.report import SetupReport
from infra.spec.job import JobRecord, JobSpec
from infra.transport.base import Transport


class JobCluster(Protocol):
    config: ClusterConfig

    @property
    def provider(self) -> NodeProvider: ...

    def nodes(self) -> list[Node]: ...

    def lock(self, command: str) -> AbstractContextManager[None]: ...

    def preemptible(self) -> bool: ...

    def setup(self, nodes: Sequence[Node], *, sync: bool = True) -> SetupReport: ...

    def ensure_autostop(self, nodes: Sequence[Node]) -> None: ...

    def start(
        self,
        names: Sequence[str] | None = None,
        *,
        command: str = "start",
        start_nodes: Callable[[list[str]], None] | None = None,
        on_running: Callable[[list[Node]], None] = ...,
    ) -> list[Node]: ...

    def local_run_dir(self, run_id: str, dest: Path | None = None) -> Path: ...

    def launch(
        self,
        spec: JobSpec,
        *,
        workdir: Path | None = None,
        on_event: Callable[[ProgressEvent], None] = ...,
        on_log: Callable[[str], None] = ...,
        on_waiting: Callable[[list[Waiting]], None] = ...,
        sync: bool = True,
    ) -> Job: ...

    def watch(self, job: Job, dest: Path) -> int: ...

    def remember(self, job: Job, exit_code: int | None = None) -> None: ...

    def last_job(self) -> JobRecord | None: ...

    def upload_outcome(
        self,
        transport: Transport,
        node: str,
        run_id: str,
        on_wait: Callable[[str], None] | None = None,
    ) -> BucketOutcome | None: ...
