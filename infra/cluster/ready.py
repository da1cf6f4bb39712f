"""What every job stands on: the nodes made ready for it (``ready_nodes``:
the one way `train`, `run`, `sweep` and `exec` get their nodes: lock, busy
check, transport, SSH, sync), and the job running now (``running_job``,
``attach``: finding an earlier job again, to watch, stop or fetch it).

A layer of ``Cluster`` (infra/cluster/api.py), below its jobs'
(infra/cluster/jobs.py); callers only ever see ``Cluster``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from infra.cluster.bucket import ClusterBucket
from infra.cluster.lifecycle import require_running
from infra.errors import StateError
from infra.jobs.job import Job
from infra.providers.base import NodeState
from infra.spec.job import JobRecord, JobSpec, Program
from infra.transport.base import Transport

if TYPE_CHECKING:
    from infra.setup.report import SetupReport

log = logging.getLogger("tfcluster")


@dataclass(frozen=True)
class ReadyNodes:
    """Nodes ready for a job (``ready_nodes``): their names, a transport
    to them, and whether the code was synced to them just now."""

    names: list[str]
    transport: Transport
    synced: bool


def _busy(record: JobRecord) -> StateError:
    """Any job, sweep or launch refused while a job runs: one line."""
    return StateError(
        f"job {record.run_id} ({record.label}) is still running; it was left as it is",
        hint="`deploy.py logs --follow` follows it, `deploy.py cancel` stops it; "
        "`--detach` starts a job without waiting for it",
    )


class ClusterReady(ClusterBucket):
    # -- the nodes, ready for a job ----------------------------------------------

    @contextlib.contextmanager
    def ready_nodes(
        self,
        command: str,
        names: Sequence[str] | None = None,
        *,
        workdir: Path | None = None,
        sync: bool = True,
        if_busy: Literal["refuse", "keep_files"] = "refuse",
        check: Callable[[Transport, list[str]], object] = lambda transport, names: None,
    ) -> Iterator[ReadyNodes]:
        """The nodes made ready for any job (`train`, `run`, `sweep`,
        `exec`), one way: under the cluster's lock (held as ``command``
        while the ``with`` lasts), refused if a job is running (with
        ``if_busy="keep_files"``: not refused, but nothing is synced: its
        files stay as they are), a transport to ``names`` (None: every
        running node of the config; a local cluster is brought up on the
        spot), SSH waited for, the nodes busy for autostop, ``check``ed,
        then the code (and ``workdir``, where given) synced unless ``sync``
        is False. The transport is the caller's to close."""
        with self.lock(command):
            # Asked once, under the lock: no job can start meanwhile.
            running = self.running_job(finish=if_busy == "refuse")
            if running is not None and if_busy == "refuse":
                raise _busy(running)
            names, transport = self._node_transport(names)
            yielded = False
            try:
                # Nodes just started (a VM booting) answer SSH a moment later.
                transport.wait_ready()
                # Busy from before the (maybe long) sync until the caller is
                # done: no node stops itself meanwhile.
                with self.keep_busy(transport, names, command):
                    check(transport, names)
                    # With keep_files, a running job's files stay as they are.
                    if sync and running is not None and transport.copies_files:
                        log.warning(
                            "a job is running: the working folder is not synced for %s", command
                        )
                    synced = sync and running is None and self._sync(transport, workdir)
                    yielded = True
                    yield ReadyNodes(names, transport, synced)
            except BaseException:
                if not yielded:  # not the caller's yet: closed here
                    transport.close()
                raise

    def _node_transport(self, names: Sequence[str] | None) -> tuple[list[str], Transport]:
        """The nodes (None: every running node of the config) and a
        transport to them, which must run (a local cluster is brought up
        on the spot: it costs nothing)."""
        existing = self.nodes()
        if names is None:
            running = {n.name for n in existing if n.state is NodeState.RUNNING}
            names = [n for n in self.config.nodes if n in running]
            if not names:
                raise StateError(f"no node of {self.config.name} is running: run `deploy.py up`")
        names = list(dict.fromkeys(names))
        for name in names:
            self.require_known(name)
        missing = [n for n in names if n not in {x.name for x in existing}]
        if missing and self.provider.capabilities().up_on_demand:
            self.provider.create_nodes(missing)
            existing = self.nodes()
        require_running(self.provider, existing, names)
        return names, self.provider.transport([n for n in existing if n.name in names])

    def _sync(self, transport: Transport, workdir: Path | None) -> bool:
        """The code (and ``workdir``) to the nodes, where the transport
        copies files; whether it was synced."""
        if not transport.copies_files:
            return False
        from infra.setup.nodes import sync_nodes

        log_sync(sync_nodes(transport, self.config, workdir=workdir))
        return True

    def running_job(self, *, finish: bool = False) -> JobRecord | None:
        """The last job, if it still runs: its chief does (or, where the
        chief cannot be seen, any of its tasks). A job ends with its chief:
        with ``finish``, what a --detach job whose chief has ended left
        running (its ps and workers: nobody watched it to stop them) is
        stopped, and the chief's exit code recorded; otherwise the cluster
        would stay busy with a job that is over."""
        record = self.last_job()
        if record is None or record.exit_code is not None:
            return None
        job = self.attach(record, require=False)
        if job is None:
            return None
        states = job.status()
        chief = states.get(job.chief.name)
        alive = [t for t in job.tasks if (s := states.get(t.name)) is not None and s.alive]
        if chief is None or chief.alive:
            return record if alive else None
        if finish:
            if alive:
                job.stop(alive)
            self._record_end(record.run_id, chief.exit_code if chief.exit_code is not None else -1)
        return None

    def _record_end(self, run_id: str, code: int) -> None:
        """The job's exit code, if it is still the last job and has none."""

        def put(data: dict[str, Any]) -> None:
            last = data.get("last_job")
            if isinstance(last, dict) and (last.get("run_id"), last.get("exit_code")) == (
                run_id,
                None,
            ):
                last["exit_code"] = code

        self.state.modify(put)

    @overload
    def attach(self, record: JobRecord) -> Job: ...
    @overload
    def attach(self, record: JobRecord, *, require: bool) -> Job | None: ...

    def attach(self, record: JobRecord, *, require: bool = True) -> Job | None:
        """The Job object of an earlier (maybe --detach'ed) job, to watch,
        stop or fetch it. With ``require`` False: None when none of its
        nodes runs, and only the running ones otherwise."""
        existing = {n.name: n for n in self.nodes() if n.state is NodeState.RUNNING}
        tasks = record.task_specs()
        nodes = sorted({t.node for t in tasks})
        if require:
            require_running(self.provider, list(existing.values()), nodes)
        else:
            tasks = [t for t in tasks if t.node in existing]
            nodes = [n for n in nodes if n in existing]
            if not any(t.type == "chief" for t in tasks):
                tasks += [t for t in record.task_specs() if t.type == "chief"]
            if not nodes:
                return None
        transport = self.provider.transport([existing[n] for n in nodes])
        spec = JobSpec(
            run_id=record.run_id,
            program=Program(argv=tuple(record.command), task_types=()),
            model=record.model,
            mode=record.mode,
        )
        job = Job(transport, tasks, spec, busy=functools.partial(self.keep_busy, transport))
        job.output_dir = record.output_dir
        return job


def log_sync(report: SetupReport) -> None:
    """What the sync before a job or exec did, per node (``-v`` shows it):
    files sent and deleted, and whether requirements.txt was installed.
    Without it a minutes-long install of the user's requirements is silent."""
    for line in report.lines():
        log.info("sync %s", line)
