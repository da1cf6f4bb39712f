"""The cluster's runs in its bucket, read back: where a run's folder is
(``bucket_url``), the runs there (``bucket_runs``: ``deploy.py runs``), the
last training (``last_bucket_run``: ``train --resume`` where this machine
knows no earlier job), and a run fetched here (``fetch_from_bucket``,
``bucket_copy``: ``fetch`` after ``down``, ``report``, ``tensorboard``).

Apart from the nodes' side of the bucket (bucket.py: uploads, data copies,
restores), which stands on it: this side runs on this machine, with this
machine's credentials, and needs no node.

A mixin of ``Cluster`` (infra/cluster/api.py). Without ``storage`` in
cluster.yaml, ``bucket_url`` and ``last_bucket_run`` are None and the
rest a clear StateError, but for a gs:// URL named in full.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from infra.cluster.base import ClusterBase
from infra.config.storage import StorageConfig
from infra.errors import ConfigError, StateError
from infra.spec.job import JobRecord
from infra.storage.urls import GsUrl, parse_gs_url, run_id_problem

if TYPE_CHECKING:
    from infra.bucket.runs import BucketRun


class ClusterBucketRuns(ClusterBase):
    """The cluster's runs in its bucket (see the module's docstring)."""

    @property
    def storage(self) -> StorageConfig | None:
        return self.config.storage

    def _need_storage(self) -> StorageConfig:
        if self.storage is None:
            raise StateError(
                f"{self.config.source} has no storage section: runs are only on the nodes; "
                "add storage: {bucket: gs://BUCKET/PREFIX} to keep them in a bucket"
            )
        return self.storage

    def bucket_url(self, run_id: str) -> GsUrl | None:
        return self.storage.run_url(self.config.name, run_id) if self.storage else None

    def last_bucket_run(self) -> JobRecord | None:
        """The newest training of the built-in trainer in the bucket, as a
        job record (``train --resume`` where this machine knows no earlier
        job: a new state folder, another machine); None without storage."""
        if self.storage is None:
            return None
        trainings = [r for r in self.bucket_runs() if r.model and r.mode]
        if not trainings:
            return None
        last = trainings[-1]
        return JobRecord(
            run_id=last.run_id,
            chief_node=self.config.roles.chief[0],
            output_dir=f"runs/{last.run_id}",
            started_at=last.started_at,
            model=last.model,
            mode=last.mode,
        )

    def bucket_runs(self) -> list[BucketRun]:
        """The runs of this cluster in its bucket (``deploy.py runs``)."""
        from infra.bucket.client import errors, open_client
        from infra.bucket.runs import list_runs

        storage = self._need_storage()
        url = storage.cluster_url(self.config.name)
        with errors(f"listing {url}"):
            return list(list_runs(open_client(storage, self.config.base_dir), url))

    def run_in_bucket(self, run: str) -> GsUrl:
        """A run as the user names it (a run id, or a gs:// URL): its folder."""
        if run.startswith("gs://"):
            try:
                return parse_gs_url(run)
            except ValueError as exc:
                raise ConfigError(f"RUN: {exc}") from None
        if (problem := run_id_problem(run)) is not None:
            raise ConfigError(f"RUN: {problem}")
        url = self.bucket_url(run)
        if url is None:
            self._need_storage()
            raise AssertionError("unreachable")
        return url

    def names_bucket_run(self, run: str) -> bool:
        """Whether ``run`` (``report``'s argument) names a run in the bucket
        rather than a folder here: a gs:// URL, or, with ``storage``, a run
        id that is no folder here. A path that is no folder (a typo) is
        not: it is said to be missing, not "not a run id"."""
        if run.startswith("gs://"):
            return True
        return self.storage is not None and not Path(run).exists() and run_id_problem(run) is None

    def bucket_copy(self, run: str) -> Path:
        """A run in the bucket (a run id or gs://...) as a folder here, for
        ``report`` and ``tensorboard``: fetched afresh into this cluster's
        state folder (``bucket-runs/``), whole, before the old copy goes."""
        url = self.run_in_bucket(run)
        # The URL's parts were checked (no '..', no empty name): folders.
        final = self.state.dir.joinpath("bucket-runs", url.bucket, *url.path.split("/"))
        final.parent.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(prefix=".fetch-", dir=final.parent))
        try:
            self.fetch_from_bucket(url, fresh / "run")
            if final.exists():
                shutil.rmtree(final)
            os.replace(fresh / "run", final)
        finally:
            shutil.rmtree(fresh, ignore_errors=True)
        return final

    def fetch_from_bucket(self, url: GsUrl, dest: Path) -> int:
        """A run folder from the bucket into ``dest``; how many files."""
        from infra.bucket.client import errors, open_client
        from infra.bucket.runs import fetch_run

        storage = self.storage or StorageConfig(bucket=f"gs://{url.bucket}")
        with errors(f"fetching {url}"):
            client = open_client(storage, self.config.base_dir)
            return fetch_run(client, url, dest, self.config.fetch.limits())
