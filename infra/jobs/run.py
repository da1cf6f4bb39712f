"""A job's life as one library call: launch, follow, remember, fetch.

``run_job`` is what `deploy.py train` and `deploy.py run` do between
parsing their options and printing the outcome: launch the job (which
remembers it in the cluster's state), follow the chief to its end (with
preemption recovery where a node is a Spot VM), remember its exit code
and bring its run folder home. It prints nothing: what happens meanwhile
goes to a ``JobReporter`` (the CLI's renders a progress bar; the default
one ignores everything), and the outcome is a ``JobResult``. So a notebook
gets the same job as the command line with

    result = Cluster(load_config("cluster.yaml")).train(steps=200)
    result.check()  # JobFailed (with the chief's exit code) unless it succeeded
"""

from __future__ import annotations

import contextlib
import json
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.bucket.commands import BucketOutcome
from infra.errors import JobFailed
from infra.jobs.failure import strategy_hint
from infra.jobs.job import Job
from infra.jobs.needs import JobCluster
from infra.jobs.progress import ProgressEvent
from infra.jobs.readiness import Waiting
from infra.jobs.recovery import Recovery
from infra.spec.job import JobSpec


class JobReporter:
    """What a front end is told while a job runs. Every method does nothing
    here: a front end overrides those it shows."""

    def launched(self, job: Job) -> None:
        """Every task started and the job remembered (before following it)."""

    def following(self) -> AbstractContextManager[object]:
        """Held while the job is followed to its end (not for --detach):
        where a progress bar lives."""
        return contextlib.nullcontext()

    def event(self, event: ProgressEvent) -> None:
        """A progress event of the chief (start, progress, eval, done, ...)
        or of the launch (its start-up timings)."""

    def log(self, line: str) -> None:
        """A line of the chief's output that is not a progress event."""

    def waiting(self, tasks: list[Waiting]) -> None:
        """While the job starts, after each readiness poll: the tasks that
        do not listen on their ports yet, with their output so far ([]
        once none is waited for)."""

    def note(self, line: str) -> None:
        """A line of tfcluster's own while the job runs (a recovery)."""


@dataclass(frozen=True)
class JobResult:
    """How a job ended (or, detached, that it started)."""

    spec: JobSpec
    job: Job  # as it last ran (a recovery may have restarted it)
    destination: Path  # where its run folder comes (came) home
    exit_code: int | None  # the chief's; None: detached, still running
    # The built-in trainer's summary: from the chief's "done" event, else
    # the fetched summary.json; a program of the user's: only its event's.
    summary: dict[str, Any] | None = None
    # What its run folder has in the cluster's bucket (None: no storage).
    bucket: BucketOutcome | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def fetched(self) -> bool:
        """Whether the run folder is here (a failed fetch was warned about:
        it is still on the chief's node)."""
        return self.destination.is_dir()

    def check(self) -> None:
        """Raise JobFailed with the chief's exit code unless the job
        succeeded (or was detached)."""
        code = self.exit_code
        if code is None or code == 0:
            return
        why = (
            f"the chief exited with code {code}"
            if code > 0
            else "the chief ended without an exit code (cancelled, killed, or its node lost)"
        )
        # The other tasks that failed, with their own codes: a worker that
        # died is most often why the chief failed.
        why += "".join(
            f"; {t.name} on {t.node} exited with code {c}" for t, c in self.job.failed_others
        )
        raise JobFailed(
            why + (f" (results so far in {self.destination})" if self.destination.exists() else ""),
            exit_code=code,
            hint=strategy_hint(self.job.failure) or "`deploy.py logs` shows every task's log",
            details=self.job.failure,
        )


def run_job(
    cluster: JobCluster,
    spec: JobSpec,
    *,
    detach: bool = False,
    dest: Path | None = None,
    workdir: Path | None = None,
    recover: bool = True,
    reporter: JobReporter | None = None,
) -> JobResult:
    """Launch ``spec`` on ``cluster`` and, unless ``detach``, follow it to
    its end; its run folder comes to ``dest`` (default
    runs/<cluster>/<run id>). Where a node is a Spot VM, a preempted node
    is started again and the job goes on from its checkpoint, unless
    ``recover`` is False (infra/jobs/recovery.py). A
    failed job is a result, not an error: ``JobResult.check`` raises it."""
    reporter = reporter or JobReporter()
    destination = cluster.local_run_dir(spec.run_id, dest)
    for line in spec.notes:
        reporter.note(line)
    job = cluster.launch(
        spec, workdir=workdir, on_event=reporter.event, on_log=reporter.log,
        on_waiting=reporter.waiting,
    )  # fmt: skip
    reporter.launched(job)
    if detach:
        return JobResult(spec, job, destination, exit_code=None)
    with reporter.following():
        if recover and cluster.preemptible():
            recovery = Recovery(
                cluster, spec, workdir=workdir, on_event=reporter.event, on_log=reporter.log,
                on_note=reporter.note,
            )  # fmt: skip
            code, job = recovery.watch(job, destination)
        else:
            code = cluster.watch(job, destination)
    summary = job.summary
    if not summary and spec.program.builtin and code == 0:
        summary = read_summary(destination)
    bucket = cluster.upload_outcome(job.transport, job.chief.node, spec.run_id, reporter.note)
    return JobResult(spec, job, destination, exit_code=code, summary=summary, bucket=bucket)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The summary.json of a fetched run folder; None where there is none."""
    try:
        data = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
