"""The bucket side of ``Cluster``: the cluster's runs in Cloud Storage
(cluster.yaml ``storage``; infra/storage/ does the work).

* ``check_bucket``: ``up`` asks it before it creates anything;
* ``bucket_env``, ``start_uploader``, ``upload_outcome``: a job's run
  folder mirrored by the node that writes it (the chief's, or a trial's)
  with the node's credentials, and what landed in the bucket at its end;
* ``drain_uploads``: ``down`` and ``stop`` wait for the nodes' pending
  uploads, bounded; Ctrl-C skips the wait and says what is not there;
* ``bucket_spec``, ``data_from_bucket``, ``restore_from_bucket``: a
  launch's ``--data-dir gs://...`` copied to each node's cache, and a run
  resumed on a new cluster given its checkpoints back from the bucket.

The runs read back to this machine (``runs``, ``fetch`` after ``down``,
``report``, ``tensorboard``) are bucket_runs.py, which this stands on.

A mixin of ``Cluster`` (infra/cluster/api.py). Every method is a no-op or a
clear StateError where cluster.yaml has no ``storage``.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from infra.bucket import commands as upload_commands
from infra.bucket.commands import BucketOutcome, UploadState
from infra.cluster.bucket_runs import ClusterBucketRuns
from infra.config.storage import StorageConfig
from infra.errors import ConfigError, RemoteError, StateError, TfclusterError, combine_errors
from infra.providers.base import Node, NodeState
from infra.spec.job import JobSpec
from infra.spec.tfconfig import TaskSpec
from infra.storage.urls import GsUrl, parse_gs_url
from infra.transport.base import Transport
from infra.transport.fanout import fan_out

log = logging.getLogger("tfcluster")

# Seconds a job's end waits for its uploader's last pass (the summary says
# what is in the bucket), and `down`/`stop` for every pending upload.
JOB_END_WAIT_S = 300.0
# Seconds the job's end waits for its uploader before it says that it waits.
JOB_END_QUICK_S = 3.0
DRAIN_WAIT_S = 600.0
# Where a key file of storage.credentials goes on a node that copies files.
NODE_KEY = "storage-key.json"


class ClusterBucket(ClusterBucketRuns):
    """The cluster's bucket (see the module's docstring)."""

    def check_bucket(self) -> None:
        """The bucket exists and the nodes' writer may write it (``up``,
        before anything is created); nothing without ``storage``."""
        if self.storage is None:
            return
        from infra.bucket.check import check_bucket

        check_bucket(self.storage, self.config.base_dir, self.provider.bucket_identity())

    def bucket_env(self, run_id: str) -> dict[str, str]:
        """TFCLUSTER_BUCKET_URL for every task of the job (none without storage)."""
        url = self.bucket_url(run_id)
        return {"TFCLUSTER_BUCKET_URL": str(url)} if url else {}

    # -- the node's uploader -----------------------------------------------------

    def _node_credentials(
        self, transport: Transport, node: str, storage: StorageConfig | None = None
    ) -> str:
        """What the node's uploader authenticates with: "adc" where the
        node has an identity of its own (GCE), else storage.credentials
        (of ``storage``, default the cluster's), a key file copied to the
        node (mode 0600, never synced) where the node is a machine of its own."""
        storage = storage or self._need_storage()
        if self.provider.capabilities().nodes_have_identity:
            return "adc"
        spec = storage.credentials
        if spec in ("adc", "anonymous"):
            return spec
        local = self.config.resolve(spec)
        if not transport.copies_files:
            return str(local)
        remote = f"{transport.layout(node).root.rstrip('/')}/{NODE_KEY}"
        try:
            key = local.read_bytes()
        except OSError as exc:
            raise ConfigError(f"storage.credentials: cannot read {local}: {exc.strerror}") from None
        quoted = shlex.quote(remote) if remote.startswith("/") else f'"$HOME"/{shlex.quote(remote)}'
        transport.run(node, f"umask 077 && : > {quoted}", timeout=30)
        transport.upload(node, key, remote)
        return remote

    def start_uploader(
        self,
        transport: Transport,
        node: str,
        *,
        run_id: str,
        run_dir: str,
        watch_task: str,
        label: str,
        command: Sequence[str],
        model: str | None = None,
        mode: str | None = None,
        url: GsUrl | None = None,
    ) -> None:
        """Start the uploader of ``run_dir`` on ``node`` (into ``url``,
        default the run's folder), until ``watch_task`` ends (nothing
        without storage). A failure to start it is a warning: the job
        runs, its folder stays on the node."""
        storage, url = self.storage, url or self.bucket_url(run_id)
        if storage is None or url is None:
            return
        record = {
            "run_id": run_id,
            "cluster": self.config.name,
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "label": label,
            "command": list(command),
            "model": model,
            "mode": mode,
        }
        try:
            script = upload_commands.start_uploader(
                transport.layout(node),
                run_id=run_id,
                run_dir=run_dir,
                watch_task=watch_task,
                url=str(url),
                endpoint=storage.api_endpoint(),
                credentials=self._node_credentials(transport, node),
                record=record,
            )
            result = transport.run(node, script, timeout=60)
        except RemoteError as exc:
            log.warning("could not start the upload to %s on %s: %s", url, node, exc)
            return
        if not result.ok:
            log.warning("could not start the upload to %s on %s: %s", url, node, result.tail())

    def uploads(
        self,
        transport: Transport,
        nodes: Sequence[str],
        wait_s: float = 0.0,
        run_id: str | None = None,
    ) -> list[UploadState]:
        """The uploaders of these nodes (waiting up to ``wait_s`` for them,
        or only ``run_id``'s, to end); a node that cannot be asked reports none."""
        scripts = {n: upload_commands.uploads(transport.layout(n), wait_s, run_id) for n in nodes}
        states: list[UploadState] = []
        try:
            results = transport.run_all(scripts, timeout=wait_s + 60)
        except RemoteError as exc:
            log.warning("could not ask about pending uploads: %s", exc)
            return states
        for result in results.values():
            states += upload_commands.parse_uploads(result.stdout)
        return states

    def wait_uploads(
        self,
        transport: Transport,
        nodes: Sequence[str],
        url: GsUrl | None,
        run_id: str | None = None,
        on_wait: Callable[[str], None] | None = None,
    ) -> list[UploadState]:
        """The end of a job or a sweep: its uploaders (or only ``run_id``'s),
        writing to ``url``, once they ended, at most JOB_END_WAIT_S from
        now. One still busy after a moment is said (``on_wait``, else a
        warning), and from then Ctrl-C skips the wait: the uploads go on,
        `down` and `stop` wait for them."""

        def states(wait_s: float) -> list[UploadState]:
            found = self.uploads(transport, nodes, wait_s, run_id)
            return [s for s in found if run_id is None or s.run_id == run_id]

        found = states(JOB_END_QUICK_S)
        if any(s.alive for s in found):
            say = on_wait or (lambda line: log.warning("%s", line))
            try:  # from the moment the wait is said, Ctrl-C skips it
                say(
                    f"waiting for the upload to {url} to finish (at most "
                    f"{JOB_END_WAIT_S:.0f} s; Ctrl-C skips the wait, and the upload goes on)"
                )
                found = states(JOB_END_WAIT_S) or found
            except KeyboardInterrupt:
                log.warning(
                    "not waiting for the upload to %s: it goes on on %s "
                    "(`deploy.py down` and `stop` wait for it)", url, ", ".join(nodes),
                )  # fmt: skip
        return found

    def upload_outcome(
        self,
        transport: Transport,
        node: str,
        run_id: str,
        on_wait: Callable[[str], None] | None = None,
    ) -> BucketOutcome | None:
        """What the job's uploader put in the bucket, once it ended
        (``wait_uploads``: the job's own outcome is kept whatever happens
        to the wait); None without storage."""
        if self.storage is None:
            return None
        found = self.wait_uploads(transport, [node], self.bucket_url(run_id), run_id, on_wait)
        if not found:
            return None
        state = found[0]
        if state.failed:
            log.warning(
                "not in the bucket: %s (%s)",
                ", ".join(sorted(state.failed)[:5]),
                next(iter(state.failed.values())),
            )
        return BucketOutcome(
            state.url, state.uploaded, state.bytes, state.pending, state.failed, not state.alive,
            state.error,
        )  # fmt: skip

    def drain_uploads(
        self, nodes: Sequence[Node], on_wait: Callable[[int], None] | None = None
    ) -> list[UploadState]:
        """Wait (at most DRAIN_WAIT_S) for the running nodes' pending
        uploads before they stop or go; what is still not in the bucket.
        Ctrl-C skips the wait, with a warning naming what is not there."""
        running = [n for n in nodes if n.state is NodeState.RUNNING]
        if self.storage is None or not running:
            return []
        try:
            transport = self.provider.transport(running)
        except TfclusterError as exc:
            log.warning("could not reach the nodes to wait for their uploads: %s", exc)
            return []
        names = [n.name for n in running]
        with transport:
            pending = [s for s in self.uploads(transport, names) if s.alive]
            if not pending:
                return []
            try:  # from the moment the wait is said, Ctrl-C skips it
                if on_wait is not None:
                    on_wait(len(pending))
                states = self.uploads(transport, names, DRAIN_WAIT_S)
            except KeyboardInterrupt:
                log.warning(
                    "not waiting for the uploads: not in the bucket: %s",
                    _missing(pending, self.bucket_url),
                )
                return pending
        left = [s for s in states if s.alive or s.pending_count]
        if left:
            log.warning(
                "not in the bucket after %.0f s: %s", DRAIN_WAIT_S, _missing(left, self.bucket_url)
            )
        return left

    def bucket_spec(
        self, spec: JobSpec, transport: Transport, tasks: Sequence[TaskSpec]
    ) -> JobSpec:
        """``spec`` as a launch runs it: its ``--data-dir gs://...`` read from
        the nodes' caches (``data_from_bucket``), and, resuming on a new
        cluster (after `down`), whose chief has no checkpoint, the bucket's
        last ones restored there first. Resuming (the same run id), the
        last run's uploader (of the same name) ends first: this run's
        could not start beside it."""
        spec = self.data_from_bucket(spec, transport, sorted({t.node for t in tasks}))
        if spec.resume:
            chief = next(t.node for t in tasks if t.type == "chief")
            if self.storage is not None:
                self.wait_uploads(transport, [chief], self.bucket_url(spec.run_id), spec.run_id)
            run_dir = f"{transport.layout(chief).runs}/{spec.run_id}"
            self.restore_from_bucket(transport, chief, run_dir, spec.run_id)
        return spec

    def data_from_bucket(
        self, spec: JobSpec, transport: Transport, names: Sequence[str]
    ) -> JobSpec:
        """``spec`` reading its ``--data-dir gs://...`` from each node's
        cache. Each node copies the folder there first (once: again only
        when an object changed), with its own credentials, before any task
        starts, as a command of its own rather than inside a task: a task
        may have no network beyond its job's (the local cluster's
        namespace), and a copy that fails is the launch's one error, not
        every task's. The trainer then checks the copy against its
        SHA256SUMS, as any data folder."""
        argv = list(spec.program.argv)
        # The built-in trainer's flag (it runs from the login's home, where
        # the cache path leads); a program of the user's reads gs:// itself.
        if not spec.program.builtin or "--data-dir" not in argv[:-1]:
            return spec
        at = argv.index("--data-dir") + 1
        if not argv[at].startswith("gs://"):
            return spec
        try:
            url = parse_gs_url(argv[at])
        except ValueError as exc:
            raise ConfigError(f"--data-dir: {exc}") from None
        storage = self.storage or StorageConfig(bucket=f"gs://{url.bucket}")
        root = transport.layout(names[0]).root.rstrip("/")
        cache = "/".join([root, "cache", "gcs", url.bucket, *url.path.split("/")]).rstrip("/")

        def stage(node: str) -> None:
            script = upload_commands.stage_data(
                transport.layout(node),
                url=str(url),
                dest=cache,
                endpoint=storage.api_endpoint(),
                credentials=self._node_credentials(transport, node, storage),
            )
            result = transport.run(node, script, timeout=3600)
            if not result.ok:
                raise RemoteError(f"{node}: could not copy {url}: {result.tail()}")

        outcome = fan_out(stage, names)
        if not outcome.ok:
            raise combine_errors(outcome.errors)
        argv[at] = cache
        return replace(spec, program=replace(spec.program, argv=tuple(argv)))

    # -- a run resumed on a new cluster ---------------------------------------

    def restore_from_bucket(
        self, transport: Transport, node: str, run_dir: str, run_id: str
    ) -> None:
        """The run's checkpoints from the bucket into ``run_dir`` on
        ``node``, unless it has a checkpoint already (nothing without
        storage). Done by the node, with its own credentials."""
        storage, url = self.storage, self.bucket_url(run_id)
        if storage is None or url is None:
            return
        script = upload_commands.restore(
            transport.layout(node),
            run_dir=run_dir,
            url=str(url),
            endpoint=storage.api_endpoint(),
            credentials=self._node_credentials(transport, node),
        )
        result = transport.run(node, script, timeout=1800)
        restored = upload_commands.parse_restored(result.stdout)
        if not result.ok or restored is None:
            raise StateError(
                f"could not restore {run_id}'s checkpoints from {url} on {node}: {result.tail()}",
                hint="`deploy.py runs` lists the runs in the bucket",
            )
        if restored:
            log.info("restored %d checkpoint file(s) of %s from %s", restored, run_id, url)


def _missing(states: Sequence[UploadState], url_of: Callable[[str], object]) -> str:
    parts = []
    for s in states:
        if s.url:
            what = ", ".join(s.pending[:5]) if s.pending else "its last pass"
        else:  # an uploader that had not written its first state yet
            what = "all of the run (its uploader had not listed its files yet)"
        more = f" (+{s.pending_count - 5})" if s.pending_count > 5 else ""
        parts.append(f"{s.url or url_of(s.run_id)}: {what}{more}")
    return "; ".join(parts)
