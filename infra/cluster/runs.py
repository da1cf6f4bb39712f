"""Runs brought home: the side of ``Cluster`` that gets a run folder here,
from the nodes while they hold it (``fetch``), else from the cluster's
bucket (``fetch_run``; infra/cluster/bucket.py reads the bucket).

A mixin of ``Cluster`` (infra/cluster/api.py), on top of the jobs
(infra/cluster/jobs.py), whose last job it fetches by default.
"""

from __future__ import annotations

import logging
from pathlib import Path

from infra.cluster.jobs import ClusterJobs
from infra.errors import HostKeyChanged, RemoteError, StateError, UnsafeRemoteEntry
from infra.spec.job import JobRecord
from infra.storage.urls import run_id_problem

log = logging.getLogger("tfcluster")


class ClusterRuns(ClusterJobs):
    def fetch_run(
        self, run: str | None = None, dest: Path | None = None
    ) -> tuple[str, Path, str]:
        """Bring a run folder home (default: the last job's): from the
        nodes while they hold it, else from the bucket (after ``down``
        too). The run id, where it is now, and where it came from."""
        record = self.last_job()
        if run is None or (record is not None and run == record.run_id):
            if record is None:
                raise StateError(
                    "no job to fetch yet: run `deploy.py train` or `deploy.py run` first"
                    + ("; `deploy.py runs` lists the runs in the bucket" if self.storage else "")
                )
            try:
                _, destination = self.fetch(dest)
                return record.run_id, destination, "the nodes"
            except (HostKeyChanged, UnsafeRemoteEntry):
                raise  # never a reason to look elsewhere
            except (StateError, RemoteError) as exc:
                if self.storage is None:
                    raise
                log.info("%s is not on the nodes (%s): from the bucket", record.run_id, exc)
            run = record.run_id
        url = self.run_in_bucket(run)
        name = url.path.rsplit("/", 1)[-1]
        run_id = name if run_id_problem(name) is None else "run"
        destination = self.local_run_dir(run_id, dest)
        self.fetch_from_bucket(url, destination)
        return run_id, destination, str(url)

    def fetch(self, dest: Path | None = None) -> tuple[JobRecord, Path]:
        """Bring the last job's run folder home (default runs/<cluster>/<run
        id>): the job and where it is now."""
        record = self.last_job()
        if record is None:
            raise StateError("no job to fetch yet: run `deploy.py train` or `deploy.py run` first")
        destination = self.local_run_dir(record.run_id, dest)
        job = self.attach(record)
        job.fetch(destination)
        return record, destination

