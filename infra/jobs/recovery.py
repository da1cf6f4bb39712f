"""Recovery during a job: a preempted node comes back, the job goes on.

Spot VMs are ~70 % cheaper, and GCE may reclaim one at any moment. Without
this, a preemption at night ends the job and loses the night. With it (on
by default where a node of the job is preemptible; ``--no-recover`` turns
it off), ``train`` and ``run`` follow their job as before, and when it ends
because a node was lost (the provider reports it TERMINATED/STOPPING, or
the node stopped answering and the provider confirms it is not running),
they say so in one line, start the node again (a zone out of capacity is
retried with backoff, up to a bound: then exit 5 with what was tried),
re-check its setup, and start the job again from its last checkpoint: the
built-in trainer with ``--resume``; a user's program with the same run id
(so the same TFCLUSTER_RUN_DIR) and ``TFCLUSTER_RESUME=1``, so it can
restore its own checkpoint. At most ``job.max_restarts`` times; the run
folder and checkpoints are kept whatever happens, so ``train --resume``
still works later.

Which loss ends a job (``critical``): the node of the chief or of a ps.
A worker lost in a job with ps tasks does not: the coordinator gives its
steps to the other workers, and the node is only started again at the end,
for the next job. Without ps tasks (a collective program) every worker
takes part in every step, so any lost node is critical. While the job
runs, a watcher thread asks the provider every few seconds; when a
critical node is gone it stops the job's other tasks, so that a chief
waiting forever on a lost ps ends and the job can be restarted.

The decision itself (``decide``) is a pure function of what the provider
reports, tested without any node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from infra.errors import CapacityError, JobFailed, RemoteError, StateError, TfclusterError
from infra.jobs.job import Job
from infra.jobs.needs import JobCluster
from infra.jobs.progress import ProgressEvent
from infra.node import commands
from infra.providers.base import Node, NodeState
from infra.setup import code_snapshot
from infra.spec.job import CANCELLED, JobSpec
from infra.spec.tfconfig import TaskSpec

log = logging.getLogger("tfcluster")

ABSENT = "ABSENT"


@dataclass(frozen=True)
class Policy:
    max_restarts: int = 3
    # Starting a node again in a zone out of capacity: tries, and the
    # pauses between them (doubling), about 8 minutes in all by default.
    capacity_tries: int = 6
    capacity_first_s: float = 15.0
    capacity_max_s: float = 120.0
    # How often the provider is asked about the job's nodes while it runs.
    poll_s: float = 10.0


@dataclass(frozen=True)
class Decision:
    """What to do once a followed job ended.

    ``done``: it succeeded; ``nodes`` were lost on the way (not critical)
    and are started again for the next job. ``fail``: it failed by itself
    (no node lost): the failure stands. ``restart``: start ``nodes`` and the
    job again. ``give_up``: nodes lost again, but no restart left.
    ``deleted``: a node is gone altogether (deleted, not stopped): nothing
    to start."""

    action: str
    nodes: tuple[str, ...] = ()


def lost_nodes(existing: Sequence[Node], names: Sequence[str]) -> dict[str, str]:
    """The named nodes that are not running, with the provider's word for
    their state (ABSENT: no such node any more)."""
    by_name = {n.name: n for n in existing}
    lost = {}
    for name in names:
        node = by_name.get(name)
        if node is None:
            lost[name] = ABSENT
        elif node.state is not NodeState.RUNNING:
            lost[name] = node.status
    return lost


def critical(lost: Mapping[str, str], tasks: Sequence[TaskSpec]) -> list[str]:
    """The lost nodes the job cannot go on without (see the module's doc)."""
    has_ps = any(t.type == "ps" for t in tasks)
    needed = {t.node for t in tasks if t.type in ("chief", "ps") or not has_ps}
    return sorted(n for n in lost if n in needed)


def decide(
    *, succeeded: bool, lost: Mapping[str, str], restarts: int, max_restarts: int
) -> Decision:
    """What follows a job's end, from the nodes the provider says are lost."""
    if succeeded:
        return Decision("done", tuple(sorted(n for n, s in lost.items() if s != ABSENT)))
    if not lost:
        return Decision("fail")
    if gone := sorted(n for n, s in lost.items() if s == ABSENT):
        return Decision("deleted", tuple(gone))
    if restarts >= max_restarts:
        return Decision("give_up", tuple(sorted(lost)))
    return Decision("restart", tuple(sorted(lost)))


def resumed(spec: JobSpec) -> JobSpec:
    """The same job, continued from its checkpoint: the same run id (its
    run folder); the built-in trainer with --resume, and TFCLUSTER_RESUME=1
    for every program (``Job`` sets it for a resumed spec)."""
    program = spec.program
    if program.builtin and "--resume" not in program.argv:
        program = replace(program, argv=(*program.argv, "--resume"))
    return replace(spec, program=program, resume=True)


def _states(lost: Mapping[str, str]) -> str:
    return ", ".join(f"{n} ({s})" for n, s in sorted(lost.items()))


class _Watch:
    """While a job runs: ask the provider about its nodes every
    ``poll_s``; once a critical one is lost, stop the job's tasks on the
    others (the chief may wait forever on a lost ps otherwise)."""

    def __init__(self, cluster: JobCluster, job: Job, poll_s: float, note: Callable[[str], None]):
        self.cluster, self.job, self.poll_s, self.note = cluster, job, poll_s, note
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="recovery-watch")

    def __enter__(self) -> _Watch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=self.poll_s + 30)

    def _run(self) -> None:
        names = sorted({t.node for t in self.job.tasks})
        while not self.done.wait(self.poll_s):
            try:
                lost = lost_nodes(self.cluster.provider.non_terminated_nodes(), names)
            except Exception as exc:  # a flaky API call: the next look may work
                log.info("recovery: could not list the nodes: %s", exc)
                continue
            if not critical(lost, self.job.tasks):
                continue
            self.note(f"lost {_states(lost)} while the job ran; stopping its other tasks")
            alive = [t for t in self.job.tasks if t.node not in lost]
            try:
                self.job.stop(alive)
            except Exception as exc:
                log.warning("could not stop the job's other tasks: %s", exc)
            return


class _Cancelled(Exception):
    """`deploy.py cancel` asked for the job's end during its recovery."""


class Recovery:
    """Follows a launched job to its end, restarting it when nodes are lost."""

    def __init__(
        self,
        cluster: JobCluster,
        spec: JobSpec,
        *,
        workdir: Path | None,
        on_event: Callable[[ProgressEvent], None],
        on_log: Callable[[str], None],
        on_note: Callable[[str], None],
        policy: Policy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.cluster = cluster
        self.spec = spec
        self.workdir = workdir
        self.on_event = on_event
        self.on_log = on_log
        self.note = on_note
        self.policy = policy or Policy(max_restarts=cluster.config.job.max_restarts)
        self.sleep = sleep
        self.restarts = 0

    def watch(self, job: Job, dest: Path) -> tuple[int, Job]:
        """The chief's exit code at the end, and the job as it last ran
        (CANCELLED once `deploy.py cancel` asked for its end)."""
        try:
            return self._watch(job, dest)
        except _Cancelled as cancelled:
            self.note(str(cancelled))
            self.cluster.remember(job, exit_code=CANCELLED)
            return CANCELLED, job

    def _watch(self, job: Job, dest: Path) -> tuple[int, Job]:
        while True:
            code, failure = self._follow(job, dest)
            if code != 0 or failure is not None:
                self._stop_if_cancelled("")
            names = sorted({t.node for t in job.tasks})
            lost = lost_nodes(self.cluster.provider.non_terminated_nodes(), names)
            decision = decide(
                succeeded=code == 0 and failure is None,
                lost=lost,
                restarts=self.restarts,
                max_restarts=self.policy.max_restarts,
            )
            if decision.action != "restart":
                return self._settle(decision, lost, code, failure), job
            job = self._restart(job, lost, names)

    def _follow(self, job: Job, dest: Path) -> tuple[int, JobFailed | None]:
        """Follow one run of the job to its end, watching its nodes meanwhile:
        the chief's exit code, or -1 and why the job could not be followed."""
        with _Watch(self.cluster, job, self.policy.poll_s, self.note):
            try:
                return self.cluster.watch(job, dest), None
            except JobFailed as exc:  # lost contact with the chief, say
                return -1, exc

    def _settle(
        self, decision: Decision, lost: Mapping[str, str], code: int, failure: JobFailed | None
    ) -> int:
        """The end of the job, for any decision but a restart: its exit
        code, or the error that says why it ends here."""
        if decision.action == "done":
            if decision.nodes:
                self.note(
                    f"{_states({n: lost[n] for n in decision.nodes})} was lost during the "
                    "job, which did without it; starting it again for the next job"
                )
                try:
                    self._start(list(decision.nodes))
                except (TfclusterError, _Cancelled) as exc:  # the job itself succeeded
                    log.warning("could not start %s again: %s", ", ".join(decision.nodes), exc)
            return code
        if decision.action == "fail":
            if failure is not None:
                raise failure
            return code
        if decision.action == "deleted":
            raise StateError(
                f"{', '.join(decision.nodes)} no longer exists (deleted, not stopped): "
                "nothing to start again",
                hint="`deploy.py up` creates it; then `deploy.py train --resume` "
                "continues from the last checkpoint",
            )
        # give_up: nodes lost again, and no restart left.
        raise JobFailed(
            f"{_states(lost)} lost again after {self.restarts} restart(s) "
            f"(job.max_restarts: {self.policy.max_restarts}); giving up",
            hint="the run folder and checkpoints are kept on the nodes: "
            "`deploy.py start`, then `deploy.py train --resume` continues",
        )

    def _restart(self, job: Job, lost: Mapping[str, str], names: list[str]) -> Job:
        """Start the lost nodes again, then the job: from its checkpoint
        when it has one."""
        self.restarts += 1
        self.note(
            f"{_states(lost)} was preempted or stopped; starting it again and restarting "
            f"the job from its last checkpoint (restart {self.restarts} of "
            f"{self.policy.max_restarts})"
        )
        self._start(names)
        if self._has_checkpoint(job):
            self.spec = resumed(self.spec)
        else:
            # Lost before its first checkpoint: the trainer's --resume
            # would refuse; it starts over (a program of yours decides
            # for itself with TFCLUSTER_RESUME).
            self.note("no checkpoint yet: the job starts over")
        # The code it started with, never today's working folder: no sync,
        # and the nodes' copies checked against what the launch recorded.
        self._check_code(names)
        self._stop_if_cancelled(" while its nodes were made ready again")
        return self.cluster.launch(
            self.spec,
            workdir=self.workdir,
            on_event=self.on_event,
            on_log=self.on_log,
            sync=False,
        )

    def _check_code(self, names: Sequence[str]) -> None:
        if self.spec.program.builtin:
            hint = "its checkpoints are kept: `deploy.py train --resume` goes on with today's code"
        else:
            hint = "its run folder is kept on the nodes: `deploy.py run` starts it again"
        existing = [n for n in self.cluster.nodes() if n.name in names]
        with self.cluster.provider.transport(existing) as transport:
            code_snapshot.check(transport, self.spec.run_id, hint=hint)

    def _stop_if_cancelled(self, when: str) -> None:
        """After each wait: end here if `deploy.py cancel` asked for it."""
        last = self.cluster.last_job()
        if last is not None and last.run_id == self.spec.run_id and last.cancelled:
            raise _Cancelled(f"{self.spec.run_id} was cancelled{when}; it is not restarted")

    def _has_checkpoint(self, job: Job) -> bool:
        """Whether the built-in trainer left a checkpoint to resume from in
        its run folder on the chief's node (a user's program: always
        resumed, TFCLUSTER_RESUME=1 lets it look for itself)."""
        if not self.spec.program.builtin:
            return True
        chief = job.chief.node
        existing = [n for n in self.cluster.nodes() if n.name == chief]
        try:
            with self.cluster.provider.transport(existing) as transport:
                result = transport.run(
                    chief,
                    commands.file_exists(f"{job.output_dir}/checkpoints/checkpoint"),
                    timeout=30,
                )
        except RemoteError:
            return True  # let --resume say what it finds
        return result.stdout.strip() != "no"

    def _start(self, names: list[str]) -> None:
        """Start those of these nodes that are not running (capacity:
        retried with backoff, up to the bound), then check their setup and
        watchers, as ``up`` would. A recovery is activity: the nodes that
        still run have their autostop clocks started again first, so that
        none stops itself while the lost one comes back."""
        existing = self.cluster.nodes()
        running = [n for n in existing if n.name in names and n.state is NodeState.RUNNING]
        if running:
            try:
                self.cluster.ensure_autostop(running)
            except TfclusterError as exc:
                log.warning("could not reach the watchers of the other nodes: %s", exc)
        names = [n for n in names if n not in {r.name for r in running}]
        if not names:
            return
        # The lifecycle's start, as `deploy.py start` (held as "recover":
        # `cancel` reads that and does not wait for it).
        self.cluster.start(
            names, command="recover", start_nodes=self._start_nodes, on_running=self._set_up
        )

    def _start_nodes(self, names: list[str]) -> None:
        """Start these stopped nodes; a zone out of capacity is retried
        with backoff, up to the policy's bound (then exit 5)."""
        policy = self.policy
        delay = policy.capacity_first_s
        tried: list[str] = []
        began = time.monotonic()
        for attempt in range(1, policy.capacity_tries + 1):
            try:
                self.cluster.provider.start_nodes(names)
                return
            except CapacityError as exc:
                self._stop_if_cancelled(f" while {', '.join(names)} could not start")
                tried.append(str(exc))
                if attempt == policy.capacity_tries:
                    raise CapacityError(
                        f"could not start {', '.join(names)} again: {attempt} tries over "
                        f"{time.monotonic() - began:.0f} s, each refused ({tried[-1]})",
                        hint="the run folder and checkpoints are kept: once the zone has "
                        "room, `deploy.py start` then `deploy.py train --resume` continues",
                    ) from None
                self.note(f"no capacity yet ({exc}); trying again in {delay:.0f} s")
                self.sleep(delay)
                self._stop_if_cancelled(f" while {', '.join(names)} could not start")
                delay = min(delay * 2, policy.capacity_max_s)

    def _set_up(self, nodes: list[Node]) -> None:
        """The nodes started again: their setup checked, as ``up`` would,
        without a sync (the job goes on with the code it started with)."""
        started = f" while {', '.join(n.name for n in nodes)} started again"
        started += " (`deploy.py stop` stops it)"
        self._stop_if_cancelled(started)
        self.cluster.setup(nodes, sync=False)
        self._stop_if_cancelled(started)
