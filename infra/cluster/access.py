"""Looking into a running cluster by hand: its task logs (once or
followed), TensorBoard on the chief's run folder, ``exec`` of a command on
the nodes (which waits for a running job's files as a launch does), a login
shell on one node, forgetting a node's pinned host key.

A layer of ``Cluster`` (infra/cluster/api.py), on its jobs' (infra/cluster/jobs.py:
`logs --follow` follows the running job to its end). Nothing here changes the
nodes, and only the end of a job whose chief has ended takes the cluster's lock.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from infra.cluster.jobs import ClusterJobs
from infra.errors import (
    ConfigError,
    JobFailed,
    RemoteError,
    StateError,
    combine_errors,
)
from infra.jobs.job import Job
from infra.jobs.log_follow import follow_all
from infra.node import commands, facts
from infra.providers.base import Node, NodeState
from infra.spec.job import JobRecord, is_run_id
from infra.state.lock import ClusterLock
from infra.text import node_text
from infra.transport.base import wanted_local_port
from infra.transport.fanout import in_threads

if TYPE_CHECKING:
    from infra.jobs.tensorboard import Board

log = logging.getLogger("tfcluster")

# How often `logs --follow` asks whether the followed job's chief still runs.
CHIEF_POLL_S = 2.0


class ClusterAccess(ClusterJobs):
    # -- tensorboard ----------------------------------------------------------------

    @contextlib.contextmanager
    def tensorboard(
        self,
        run_id: str | None = None,
        *,
        local_port: int = 0,
        exact_port: bool = False,
        on_starting: Callable[[str], None] = lambda node: None,
    ) -> Iterator[tuple[Board, Callable[[], None]]]:
        """TensorBoard on the run folder of ``run_id`` (default: the last
        job's) on the chief's node (infra/jobs/tensorboard.py), reachable here
        while the ``with`` lasts: the Board (its ``url``) and a function
        that returns only when TensorBoard has ended (RemoteError) or on
        Ctrl-C (KeyboardInterrupt). Stopped on the node at the end.
        ``on_starting(node)`` once the run and node are checked, before
        TensorBoard's start (which takes a while). ``local_port`` taken:
        any free one, unless ``exact_port`` (then a ConfigError, before
        anything starts)."""

        local_port = wanted_local_port(local_port, exact=exact_port)
        record = self.last_job()
        if run_id is not None and run_id.startswith("gs://"):
            with self._serve_copy(run_id, local_port, on_starting) as served:
                yield served
            return
        self._check_board_run(run_id, record)
        chief = record.chief_node if record is not None else self.config.roles.chief[0]
        node = next(
            (n for n in self.nodes() if n.name == chief and n.state is NodeState.RUNNING), None
        )
        if node is None and self.config.storage is not None:
            # The nodes are gone (or stopped): the run is in the bucket.
            run = run_id if run_id is not None else record.run_id if record else ""
            with self._serve_copy(run, local_port, on_starting) as served:
                yield served
            return
        if node is None:
            raise StateError(
                f"{chief}, the chief's node, is not running: the run folders are there; "
                "`deploy.py start` (or up), or look at a fetched run locally"
            )
        with (
            self._one_board(),
            self._serve_board(node, record, run_id, local_port, on_starting) as served,
        ):
            yield served

    def _check_board_run(self, run_id: str | None, record: JobRecord | None) -> None:
        """Refuse a TensorBoard with no run to show, or on what is no run id."""
        if run_id is None and record is None:
            raise StateError(
                f"no job has run on {self.config.name} yet: no run folder to show; "
                "`deploy.py train` starts one"
            )
        if run_id is not None and not is_run_id(run_id):
            raise ConfigError(
                f"{run_id[:60]!r} is not a run id (lowercase letters, digits and '-'); "
                "`deploy.py status` names the last job"
            )

    @contextlib.contextmanager
    def _one_board(self) -> Iterator[None]:
        """One TensorBoard per cluster at a time: a second `deploy.py
        tensorboard` would stop the first one's task (the same task name)
        under it, and leave its user a dead URL."""
        board_lock = ClusterLock(self.state.dir / "tensorboard.lock", self.config.name)
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(board_lock.hold("tensorboard", wait=0))
            except StateError:
                holder = board_lock.holder()
                raise StateError(
                    f"TensorBoard is already open for {self.config.name}: "
                    + (holder.describe() if holder else "another `deploy.py tensorboard`"),
                    hint="use the URL it printed, or close it (Ctrl-C) first",
                ) from None
            yield

    @contextlib.contextmanager
    def _serve_copy(
        self, run: str, local_port: int, on_starting: Callable[[str], None]
    ) -> Iterator[tuple[Board, Callable[[], None]]]:
        """TensorBoard here, on a copy of a run in the cluster's bucket."""
        from infra.jobs import tensorboard
        from infra.providers.local import LocalTransport

        folder = self.bucket_copy(run)
        homes = self.state.dir / "bucket-board"
        (homes / "here").mkdir(parents=True, exist_ok=True)
        transport = LocalTransport(["here"], homes)
        on_starting("this machine")
        with tensorboard.serve(transport, "here", str(folder), local_port) as board:
            yield board, functools.partial(tensorboard.watch, transport, board)

    @contextlib.contextmanager
    def _serve_board(
        self,
        node: Node,
        record: JobRecord | None,
        run_id: str | None,
        local_port: int,
        on_starting: Callable[[str], None],
    ) -> Iterator[tuple[Board, Callable[[], None]]]:
        from infra.jobs import tensorboard

        with self.provider.transport([node]) as transport:
            if run_id is None or (record is not None and run_id == record.run_id):
                assert record is not None
                logdir = record.output_dir
            else:
                logdir = f"{transport.layout(node.name).runs}/{run_id}"
            on_starting(node.name)
            with tensorboard.serve(transport, node.name, logdir, local_port) as board:
                yield board, functools.partial(tensorboard.watch, transport, board)

    # -- logs ---------------------------------------------------------------------

    def log_nodes(self, node: str | None) -> list[Node]:
        running = [n for n in self.nodes() if n.state is NodeState.RUNNING]
        if node is not None:
            self.require_known(node)
            running = [n for n in running if n.name == node]
            if not running:
                raise StateError(f"{node} is not running; `deploy.py status` shows the nodes")
        return running

    def logs(
        self,
        node: str | None,
        *,
        lines: int,
        follow: bool,
        on_line: Callable[[str, str, str], None],
    ) -> JobEnd | None:
        """Task logs of the running nodes; ``on_line(node, task, line)``.
        Not silence where there is nothing to show: a StateError (one
        line) when no node runs, and when no task log exists and no job
        has run (a fresh cluster). With ``follow``, the logs are followed
        while the last job runs, and its end (``JobEnd``) returned: at
        once when it had ended already, else when its chief ends (what a
        --detach job left running is then stopped, as a job's end does)."""
        nodes = self.log_nodes(node)
        if not nodes and self.last_job() is not None:
            raise StateError(
                f"no node of {self.config.name} is running: no logs to show "
                "(`deploy.py status` shows the nodes)"
            )
        shown = 0

        def counted(node_name: str, task: str, line: str) -> None:
            nonlocal shown
            shown += 1
            on_line(node_name, task, line)

        record = self.last_job()
        running = None
        if follow and record is not None and record.exit_code is None:
            running = self.running_job()
            if running is None:  # its chief had ended: the job's end, as below
                with contextlib.suppress(StateError), self.lock("logs"):
                    self.running_job(finish=True)
        # No job known (a state file rebuilt): followed until Ctrl-C, as is.
        forever = follow and record is None
        if nodes:
            self._show_logs(nodes, lines, counted, running=running, forever=forever)
        if not shown and record is None:
            raise StateError(
                f"no job has run on {self.config.name} yet: no logs to show; "
                "`deploy.py train` or `deploy.py run` starts one"
            )
        if not follow or record is None:
            return None
        return self._job_end(record.run_id, was_running=running is not None)

    def _show_logs(
        self,
        nodes: Sequence[Node],
        lines: int,
        on_line: Callable[[str, str, str], None],
        *,
        running: JobRecord | None,
        forever: bool,
    ) -> None:
        """The last ``lines`` of each task log on ``nodes``; followed while
        the ``running`` job runs (its end recorded once its chief ended),
        or until Ctrl-C (``forever``)."""
        with self.provider.transport(nodes) as transport:
            names = [n.name for n in nodes]
            if running is not None:
                tasks = running.task_specs()
                until = {n: [t.name for t in tasks if t.node == n] for n in names}
                with self._finish_when_chief_ends(running):
                    follow_all(transport, names, lines, on_line, until)
            elif forever:
                follow_all(transport, names, lines, on_line, None)
            else:
                for n in names:
                    result = transport.run(n, commands.tail_logs(transport.layout(n), lines, False))
                    for task, line in facts.parse_tail(result.stdout):
                        on_line(n, task, line)

    @contextlib.contextmanager
    def _finish_when_chief_ends(self, record: JobRecord) -> Iterator[None]:
        """While the ``with`` lasts, watch the job's chief; once it has
        ended, what of the job still runs (a --detach job's ps and workers:
        nobody else stops them) is stopped and its exit code recorded,
        under the cluster's lock, as the launch of a next job would. Once
        more at the end of the ``with`` (the follow ended with the tasks),
        so that the end is recorded however quickly it came."""
        job = self.attach(record, require=False)  # here: the provider is asked in this thread
        if job is None:
            yield
            return
        done = threading.Event()

        def watch() -> None:
            while not done.wait(CHIEF_POLL_S):
                if self._finish_ended(record, job):
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()
        self._finish_ended(record, job)

    def _finish_ended(self, record: JobRecord, job: Job) -> bool:
        """Whether the job's chief has ended; if so, and nobody recorded the
        job's end yet, stop what of it still runs and record its code."""
        try:
            chief = job.status().get(job.chief.name)
            if chief is not None and chief.alive:
                return False
            with self.lock("logs"):
                last = self.last_job()
                # Recorded by its own watcher (which stops the rest itself),
                # or a newer job: left as it is.
                if last is None or (last.run_id, last.exit_code) != (record.run_id, None):
                    return True
                job.stop([t for t in job.tasks if t is not job.chief])
                code = chief.exit_code if chief and chief.exit_code is not None else -1
                self._record_end(record.run_id, code)
        except (RemoteError, StateError) as exc:
            log.warning("could not see whether job %s has ended: %s", record.run_id, exc)
        return True

    def _job_end(self, run_id: str, *, was_running: bool) -> JobEnd:
        """How the last job ended (its recorded exit code, None if none)."""
        record = self.last_job()
        code = record.exit_code if record is not None and record.run_id == run_id else None
        return JobEnd(run_id, code, ended_now=was_running)

    # -- a command on the nodes ------------------------------------------------------

    def exec(
        self,
        argv: Sequence[str],
        nodes: Sequence[str] | None,
        *,
        workdir: Path,
        on_line: Callable[[str, str], None],
    ) -> dict[str, int]:
        """Run ``argv`` on these nodes (default: every running one) in the
        working folder, all at once; ``on_line(node, line)`` for each line
        of output. Returns each node's exit code. The folder is synced
        first, unless a job is running (its files stay as they are)."""
        if not argv:
            raise ConfigError("no command to run: put it after --, e.g. -- nvidia-smi")
        # Ready (and synced) under the lock, as a launch is; the lock is
        # not held while the command runs (a long `exec -- nvidia-smi -l`
        # must not keep `cancel` out). A running job is not refused: its
        # files stay as they are. The command keeps its node busy itself
        # (its pid file).
        ready = self.ready_nodes("exec", nodes or None, workdir=workdir, if_busy="keep_files")
        with ready as nodes_ready:
            names, transport = nodes_ready.names, nodes_ready.transport
        codes: dict[str, int] = {}
        errors: dict[str, RemoteError] = {}

        def one(node: str) -> None:
            command = commands.in_workdir(
                transport.layout(node), transport.workdir(node, workdir), argv
            )
            try:
                codes[node] = transport.stream(
                    node, command, lambda line: on_line(node, node_text(line))
                )
            except RemoteError as exc:
                errors[node] = exc

        with transport:
            in_threads(one, names)
        if errors:
            # Every node ran it; a changed host key then keeps its type
            # (exit 8: the first in the nodes' order), never one line of many.
            raise combine_errors({n: errors[n] for n in names if n in errors})
        return {n: codes[n] for n in names}

    # -- one node, by hand --------------------------------------------------------

    def forget_host(self, node: str) -> None:
        """Forget NODE's pinned SSH host key (after it was re-created on
        purpose): the next connection pins the new one."""
        from infra.transport.host_keys import forget_host

        self.require_known(node)
        nodes = {n.name: n for n in self.nodes()}
        if node not in nodes or not nodes[node].ssh_host:
            raise ConfigError(f"{node} is not a node of {self.config.name} with an SSH address")
        forget_host(self.state.known_hosts, nodes[node].ssh_host or "", nodes[node].ssh_port)

    def shell(self, node: str) -> NodeShell:
        """An interactive login shell on the running ``node``, until it
        exits; a local node has none (it is a folder on this machine)."""
        nodes = self.log_nodes(node)
        with self.provider.transport(nodes) as transport:
            code = transport.interactive(node)
            if code is not None:
                return NodeShell(node, exit_code=code)
            folder = transport.local_folder(node)
            if folder is None:
                raise StateError(f"{node}: no shell can be opened on a {self.provider.kind} node")
            return NodeShell(node, folder=folder)


def check_exec(codes: Mapping[str, int]) -> None:
    """Raise ``JobFailed`` (the first failed node's exit code) unless the
    command ``exec`` ran (its codes) succeeded on every node."""
    failed = {node: code for node, code in codes.items() if code != 0}
    if failed:
        raise JobFailed(
            f"failed on {len(failed)} of {len(codes)} node(s): "
            + ", ".join(f"{node} exit {code}" for node, code in failed.items()),
            exit_code=next(iter(failed.values())),
        )


@dataclass(frozen=True)
class JobEnd:
    """The end of the job `logs --follow` followed: its exit code (None
    where none is recorded yet) and whether it ended while followed."""

    run_id: str
    exit_code: int | None
    ended_now: bool


@dataclass(frozen=True)
class NodeShell:
    """What ``Cluster.shell`` did: a shell ran (its exit code), or the node
    is the local ``folder`` (nothing was opened)."""

    node: str
    exit_code: int = 0
    folder: Path | None = None
