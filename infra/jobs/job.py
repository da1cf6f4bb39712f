"""Running one job on a cluster: start, watch, stop, fetch.

A job is one program (``Program``: the built-in trainer, or the user's own
command) run as one process per TensorFlow task, each with its TF_CONFIG.
Order matters for TensorFlow: ps and workers first, then a readiness check
(their ports listen), then the chief, whose log is streamed until it ends;
then the other tasks are stopped and the chief's run folder comes home.
Every step goes through a ``Transport`` with the commands of
``infra/node/commands.py``, so it is the same for local processes and VMs.
What a job is (``Program``, ``JobSpec``, run ids, the ``JobRecord`` the
state file keeps) is infra/spec/job.py; this module runs one.

A job only ever stops the tasks it started itself: when a start is refused
because a task of that name still runs (another job), that job is left as
it was.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infra.errors import (
    HostKeyChanged,
    Interrupted,
    JobFailed,
    RemoteError,
    StateError,
    UnsafeRemoteEntry,
    combine_errors,
)
from infra.jobs import failure, readiness
from infra.jobs.progress import StartupClock
from infra.jobs.protocol import ProgressEvent, parse_line
from infra.jobs.readiness import Waiting, ready_wait
from infra.node import commands, facts, task_env
from infra.node.watchdog import Watch, task_watch
from infra.spec.job import JobRecord, JobSpec
from infra.spec.tfconfig import TaskSpec, tf_config_json
from infra.text import node_text
from infra.transport.base import CommandResult, Transport

log = logging.getLogger("tfcluster")


def shielded(report: Callable[[Any], None]) -> Callable[[Any], None]:
    """``report`` (a front end's, given the chief's events and lines), made
    unable to end the job: whatever the chief prints, a reporter that fails
    on it (a bug in a view) costs that line, never the job or its tasks."""
    if getattr(report, "shields", None) is not None:
        return report

    def shield(what: Any) -> None:
        try:
            report(what)
        except Exception as exc:
            log.debug("the reporter failed on the chief's line", exc_info=True)
            log.warning("could not show a line of the chief's (%r); the job goes on", exc)

    shield.shields = report  # type: ignore[attr-defined]
    return shield


class Job:
    """One job's tasks on a cluster, through ``transport``."""

    def __init__(
        self,
        transport: Transport,
        tasks: Sequence[TaskSpec],
        spec: JobSpec,
        *,
        env: Mapping[str, str] | None = None,
        workdir: Path | None = None,
        on_event: Callable[[ProgressEvent], None] = lambda e: None,
        on_log: Callable[[str], None] = lambda line: None,
        on_waiting: Callable[[list[Waiting]], None] = lambda waiting: None,
        ready_timeout: float | None = None,
        clock: StartupClock | None = None,
        busy: Callable[[Sequence[str], str], AbstractContextManager[object]] | None = None,
    ) -> None:
        """``busy(nodes, what)``: held while the job's fetch works on the
        chief's node, so that autostop counts it as busy
        (``Cluster.keep_busy``); none by default."""
        self.transport = transport
        on_event, on_log = shielded(on_event), shielded(on_log)
        self.busy = busy or (lambda nodes, what: contextlib.nullcontext())
        # The start-up's stages, said as events (and told to the chief).
        self.clock = clock or StartupClock(on_event)
        self.tasks = list(tasks)
        self.spec = spec
        self.env = dict(env or {})
        self.workdir = workdir
        self.on_event = on_event
        self.on_log = on_log
        # The tasks not listening yet, after each readiness poll (then [],
        # once none is waited for): a front end's live line per task.
        self.on_waiting = on_waiting
        # None: TFCLUSTER_READY_WAIT, read when the job waits (a job only
        # attached to, for `status` or `cancel`, never reads it).
        self.ready_timeout = ready_timeout
        chiefs = [t for t in self.tasks if t.type == "chief"]
        if len(chiefs) != 1:
            raise StateError("a job needs exactly one chief task")
        self.chief = chiefs[0]
        self.output_dir = self.run_dir(self.chief.node)
        self.summary: dict[str, Any] | None = None
        # The tasks this job started: the only ones it may stop.
        self.started: list[TaskSpec] = []
        # After run(): the last log lines of the tasks that failed, and the
        # tasks other than the chief that failed, with their exit codes.
        self.failure: list[str] = []
        self.failed_others: list[tuple[TaskSpec, int]] = []
        # Once the chief ended (watch): its exit code, -1 when it left none;
        # set before the fetch, which may still fail.
        self.exit_code: int | None = None

    def run_dir(self, node: str) -> str:
        """The job's output folder on ``node`` (its TFCLUSTER_RUN_DIR)."""
        return f"{self.transport.layout(node).runs}/{self.spec.run_id}"

    def record(self) -> JobRecord:
        return JobRecord(
            run_id=self.spec.run_id,
            chief_node=self.chief.node,
            output_dir=self.output_dir,
            tasks=[asdict(t) for t in self.tasks],
            started_at=datetime.now(UTC).isoformat(timespec="seconds"),
            command=list(self.spec.program.argv),
            model=self.spec.model,
            mode=self.spec.mode,
        )

    # -- start -------------------------------------------------------------------

    def start(self) -> None:
        """Start ps and workers, wait for their ports, then start the chief;
        or, for a chief that waits for their ports itself, all of them at
        once (each task's seconds of imports overlap), then wait the same.
        A task that dies before it listens ends the job either way.
        Whatever goes wrong (Ctrl-C too), what this job started is stopped."""
        others = [t for t in self.tasks if t is not self.chief]
        if self.ready_timeout is None:  # a bad TFCLUSTER_READY_WAIT: before any start
            self.ready_timeout = ready_wait()
        try:
            if self.spec.program.chief_waits:
                self._start([*others, self.chief])
                self.clock.mark("start_tasks")
                self._wait_ready(others)
            else:
                self._start(others)
                self.clock.mark("start_tasks")
                self._wait_ready(others)
                if others:
                    self.clock.mark("ready")
                self._start([self.chief])
        except KeyboardInterrupt:
            self.stop(self.started)
            raise Interrupted("interrupted: every task the job had started was stopped") from None

    def _start(self, tasks: Sequence[TaskSpec]) -> None:
        by_node: dict[str, list[TaskSpec]] = defaultdict(list)
        for task in tasks:
            by_node[task.node].append(task)
        private = self._private_env()
        # Node by node, not run_all, and each node's tasks recorded as soon
        # as it answers: when another node cannot be reached, or Ctrl-C
        # comes meanwhile, what was started must be known, to be stopped.
        results: dict[str, CommandResult] = {}
        unreachable: dict[str, RemoteError] = {}

        def start_on(node: str) -> None:
            try:
                # The user's values: a file the start script reads, then
                # removes when it ends (infra/node/task_env.py).
                env_file = task_env.put(self.transport, node, self.spec.run_id, private)
                script = "\n".join(
                    [
                        *(commands.remove_on_exit(env_file) if env_file else []),
                        *(self._start_command(t, env_file) for t in by_node[node]),
                    ]
                )
                result = self.transport.run_in_task_network(node, script, timeout=60)
            except RemoteError as exc:
                unreachable[node] = exc
                return
            results[node] = result
            started = facts.parse_started(result.stdout)
            self.started += [t for t in by_node[node] if t.name in started]

        with ThreadPoolExecutor(max_workers=min(16, len(by_node)) or 1) as pool:
            list(pool.map(start_on, by_node))
        if unreachable:
            self.stop(self.started)
            # A changed host key keeps its type (and exit code).
            raise combine_errors({n: unreachable[n] for n in sorted(unreachable)})
        problems = []
        for node in by_node:
            result = results[node]
            if not result.ok:
                problems.append(f"{node}: {result.tail()}")
        if problems:
            # Only what this job started: a refusal ("already running") means
            # another job's task, which must go on as it was.
            self.stop(self.started)
            refused = any("already running" in p for p in problems)
            raise (StateError if refused else JobFailed)(
                "could not start the job: " + "; ".join(sorted(problems)),
                hint="another job is running: `deploy.py logs --follow` follows it, "
                "`deploy.py cancel` stops it"
                if refused
                else "`deploy.py logs` shows the task logs",
            )

    def _private_env(self) -> dict[str, str]:
        """The values the user (and the provider) set for every task: they
        reach the tasks through a file, never a command line."""
        return {**dict(self.spec.program.env), **self.env}

    def _start_command(self, task: TaskSpec, env_file: str | None) -> str:
        layout = self.transport.layout(task.node)
        program = self.spec.program
        own = {
            "TF_CONFIG": tf_config_json(self.tasks, task),
            "TFCLUSTER_RUN_ID": self.spec.run_id,
            "TFCLUSTER_TASK": task.name,
        }
        if self.spec.resume:
            own["TFCLUSTER_RESUME"] = "1"
        if task is self.chief:
            own.update(self.clock.for_chief())
        cwd = None
        if program.in_workdir:
            if self.workdir is None:
                raise StateError("this program runs in a working folder, and none was given")
            cwd = self.transport.workdir(task.node, self.workdir)
        path_env = {"PYTHONPATH": layout.code} if program.builtin else {}
        # Each script is wrapped in a subshell: one task's `exit` (or `cd`)
        # must not affect the next task's start on the same node.
        script = commands.start_task(
            layout,
            task.name,
            program.argv,
            task_env.split(self._private_env(), own),
            cwd=cwd,
            run_dir=self.run_dir(task.node),
            path_env=path_env,
            env_file=env_file,
            # The chief's end is the job's; every other task ends with it.
            watch=None if task is self.chief else self._watch(task),
        )
        return "(\n" + script + "\n)"

    def _watch(self, task: TaskSpec) -> Watch:
        return task_watch(self.transport, self.chief, task, self.spec.run_id)

    def _wait_ready(self, tasks: Sequence[TaskSpec]) -> None:
        """Wait until every task listens on its port (infra/jobs/readiness.py)."""
        readiness.wait_ready(self, tasks)

    # -- watch -------------------------------------------------------------------

    def follow(self) -> int | None:
        """Stream the chief's log until it ends; return its exit code (None
        when it left none: killed, or its node lost)."""
        layout = self.transport.layout(self.chief.node)
        exit_code: int | None = None
        saw_marker = False

        def on_line(line: str) -> None:
            nonlocal exit_code, saw_marker
            if facts.is_exit_marker(line):
                saw_marker = True
                exit_code = facts.parse_exit_marker(line)
                return
            event = parse_line(line)
            if event is None:
                self.on_log(node_text(line))
                return
            if event.kind == "done":
                self.summary = event.get("summary")
            self.on_event(event)

        try:
            self.transport.stream(
                self.chief.node, commands.follow_log(layout, self.chief.name), on_line
            )
        except HostKeyChanged:
            raise  # not a failed job: a node that may be someone else's (exit 8)
        except RemoteError as exc:
            raise JobFailed(
                f"lost contact with the chief on {self.chief.node}: {exc}",
                hint="check `deploy.py status`; after `deploy.py start` or `up`, "
                "`deploy.py train --resume` continues from the last checkpoint",
            ) from None
        if not saw_marker:
            raise JobFailed(
                f"the chief's log on {self.chief.node} ended without its exit status",
                hint="check `deploy.py status` and `deploy.py logs`",
            )
        return exit_code

    def status(self) -> dict[str, facts.TaskStatus]:
        by_node: dict[str, list[str]] = defaultdict(list)
        for task in self.tasks:
            by_node[task.node].append(task.name)
        out: dict[str, facts.TaskStatus] = {}
        changed: HostKeyChanged | None = None
        for node, names in by_node.items():
            try:
                result = self.transport.run(
                    node, commands.task_status(self.transport.layout(node), names), timeout=30
                )
            except HostKeyChanged as exc:
                # Not "no status" (a node that is gone): one that may be
                # someone else's; the others are asked, then it is raised.
                changed = changed or exc
                continue
            except RemoteError:
                continue
            out.update(facts.parse_task_status(result.stdout))
        if changed is not None:
            raise changed
        return out

    def running(self) -> list[TaskSpec]:
        """The job's tasks that still run."""
        alive = self.status()
        return [t for t in self.tasks if (s := alive.get(t.name)) is not None and s.alive]

    def failure_details(self, tasks: Sequence[TaskSpec]) -> list[str]:
        """What these tasks' logs end with (infra/jobs/failure.py)."""
        return failure.failure_details(self.transport, tasks)

    def failed_tasks(self) -> list[TaskSpec]:
        """The chief and every other task that ended with a non-zero code;
        the others' codes are kept in ``failed_others`` (a dead worker is
        most often why the chief failed)."""
        states = self.status()
        failed = [
            t
            for t in self.tasks
            if (s := states.get(t.name)) and not s.alive and s.exit_code not in (0, None)
        ]
        self.failed_others = [
            (t, code) for t in failed if t is not self.chief and (code := states[t.name].exit_code)
        ]
        return sorted(failed, key=lambda t: t is not self.chief)

    # -- stop and fetch ----------------------------------------------------------

    def stop(self, tasks: Sequence[TaskSpec] | None = None) -> list[str]:
        """Stop tasks (all by default) on every node that answers; a node
        that is gone (stopped, killed) has nothing left to stop. A node
        whose host key changed is not one that is gone: the others are
        stopped all the same, then its ``HostKeyChanged`` is raised."""
        by_node: dict[str, list[str]] = defaultdict(list)
        for task in tasks if tasks is not None else self.tasks:
            by_node[task.node].append(task.name)
        changed: list[HostKeyChanged] = []

        def stop_on(node: str) -> list[str]:
            names = by_node[node]
            try:
                result = self.transport.run(
                    node, commands.stop_tasks(self.transport.layout(node), names), timeout=60
                )
            except HostKeyChanged as exc:
                changed.append(exc)
                return []
            except RemoteError as exc:
                log.warning("could not reach %s to stop %s: %s", node, ", ".join(names), exc)
                return []
            return facts.parse_stopped(result.stdout)

        # All nodes at once: each may wait out the grace of a program that
        # ignores SIGTERM, and those waits must not add up. A changed host
        # key is raised once every other node has been stopped.
        with ThreadPoolExecutor(max_workers=min(16, len(by_node)) or 1) as pool:
            stopped = [name for names in pool.map(stop_on, list(by_node)) for name in names]
        if changed:
            raise changed[0]
        return stopped

    def fetch(self, dest: Path) -> Path:
        try:
            # Here, for every transport: a file in the way or a folder one
            # cannot write is one line (and after `run`, a warning), never a crash.
            dest.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RemoteError(
                f"cannot fetch into {str(dest)[:60]!r}: {exc.strerror or exc}",
                hint="`deploy.py fetch --dest FOLDER` brings the run folder to another place",
            ) from None
        with self.busy([self.chief.node], "fetch"):
            self.transport.fetch(self.chief.node, self.output_dir, dest)
        return dest

    def run(self, dest: Path) -> int:
        """start, then ``watch``."""
        self.start()
        return self.watch(dest)

    def watch(self, dest: Path) -> int:
        """Follow the started job to its end, stop the rest, fetch; the
        chief's exit code. Ctrl-C stops every task of the job."""
        started = time.monotonic()
        try:
            code = self.follow()
        except KeyboardInterrupt:
            self.exit_code = Interrupted.exit_code  # recorded: 130, as a shell says it
            self.stop()
            raise Interrupted(
                "interrupted: every task of the job was stopped",
                hint="`deploy.py train --resume` continues a training from its last checkpoint",
            ) from None
        except BaseException:
            self.stop()
            raise
        self.exit_code = code if code is not None else -1
        try:
            failed = self.failed_tasks() if code != 0 else []
        finally:
            # Even when a node's host key changed (failed_tasks raises it):
            # the other tasks must not outlive the job.
            self.stop([t for t in self.tasks if t is not self.chief])
        log.info("chief ended after %.0f s with exit code %s", time.monotonic() - started, code)
        try:
            self.fetch(dest)
        except (HostKeyChanged, UnsafeRemoteEntry):
            raise  # a node that may be someone else's: an error, never a warning
        except RemoteError as exc:  # a fetch limit too: its hint says which to raise
            hint = f"; {exc.hint}" if exc.hint else ""
            log.warning("could not fetch the run folder: %s%s", exc, hint)
        if failed:
            self.failure = self.failure_details(failed)
        return self.exit_code
