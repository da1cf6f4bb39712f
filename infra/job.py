"""Running one training job on a cluster: start, watch, stop, fetch.

Order matters for TensorFlow: ps and workers first, then a readiness check
(their ports listen), then the chief, whose log is streamed until it ends;
then the other tasks are stopped and the chief's run folder comes home.
Every step goes through a ``Transport`` with the commands of
``infra/commands.py``, so it is the same for local processes and VMs.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infra import commands, facts
from infra.errors import Interrupted, JobFailed, RemoteError, StateError
from infra.progress import ProgressEvent, parse_line
from infra.tfconfig import TaskSpec, tf_config_json
from infra.transport import Transport

log = logging.getLogger("tfcluster")


@dataclass(frozen=True)
class JobSpec:
    """What to train; cluster.yaml's ``job`` with command-line overrides."""

    run_id: str
    model: str
    mode: str
    steps: int
    batch_size: int
    checkpoint_every: int
    learning_rate: float | None = None
    data_dir: str | None = None  # on the nodes; relative = from the login's home
    extra_args: tuple[str, ...] = ()
    resume: bool = False


def new_run_id(model: str, mode: str, now: datetime | None = None) -> str:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return f"{model}-{mode}-{stamp}"


def trainer_argv(spec: JobSpec, output_dir: str) -> list[str]:
    """The flags every task of the job gets (the same on each: the trainer
    reads its own role from TF_CONFIG)."""
    argv = [
        "--model", spec.model,
        "--mode", spec.mode,
        "--steps", str(spec.steps),
        "--batch-size", str(spec.batch_size),
        "--checkpoint-every", str(spec.checkpoint_every),
        "--output-dir", output_dir,
    ]  # fmt: skip
    if spec.learning_rate is not None:
        argv += ["--learning-rate", repr(spec.learning_rate)]
    if spec.data_dir:
        argv += ["--data-dir", spec.data_dir]
    if spec.resume:
        argv.append("--resume")
    argv += list(spec.extra_args)
    return argv


@dataclass
class JobRecord:
    """What the state file remembers of the last job (for logs, fetch,
    --resume and --detach)."""

    run_id: str
    mode: str
    model: str
    chief_node: str
    output_dir: str  # on the chief node
    tasks: list[dict[str, Any]] = field(default_factory=list)
    started_at: str = ""
    exit_code: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRecord:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def task_specs(self) -> list[TaskSpec]:
        return [TaskSpec(**t) for t in self.tasks]


class Job:
    """One job's tasks on a cluster, through ``transport``."""

    def __init__(
        self,
        transport: Transport,
        tasks: Sequence[TaskSpec],
        spec: JobSpec,
        *,
        env: dict[str, str] | None = None,
        on_event: Callable[[ProgressEvent], None] = lambda e: None,
        on_log: Callable[[str], None] = lambda line: None,
        ready_timeout: float = 240.0,
    ) -> None:
        self.transport = transport
        self.tasks = list(tasks)
        self.spec = spec
        self.env = dict(env or {})
        self.on_event = on_event
        self.on_log = on_log
        self.ready_timeout = ready_timeout
        chiefs = [t for t in self.tasks if t.type == "chief"]
        if len(chiefs) != 1:
            raise StateError("a job needs exactly one chief task")
        self.chief = chiefs[0]
        self.output_dir = f"{transport.layout(self.chief.node).runs}/{spec.run_id}"
        self.summary: dict[str, Any] | None = None

    def record(self) -> JobRecord:
        return JobRecord(
            run_id=self.spec.run_id,
            mode=self.spec.mode,
            model=self.spec.model,
            chief_node=self.chief.node,
            output_dir=self.output_dir,
            tasks=[asdict(t) for t in self.tasks],
            started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )

    # -- start -------------------------------------------------------------------

    def start(self) -> None:
        """Start ps and workers, wait for their ports, then start the chief."""
        others = [t for t in self.tasks if t is not self.chief]
        self._start(others)
        self._wait_ready(others)
        self._start([self.chief])

    def _start(self, tasks: Sequence[TaskSpec]) -> None:
        by_node: dict[str, list[TaskSpec]] = defaultdict(list)
        for task in tasks:
            by_node[task.node].append(task)
        scripts = {
            node: "\n".join(self._start_command(t) for t in node_tasks)
            for node, node_tasks in by_node.items()
        }
        results = self.transport.run_all(scripts, timeout=60)
        failed = {node: r for node, r in results.items() if not r.ok}
        if failed:
            self.stop()
            raise JobFailed(
                "could not start the tasks on "
                + "; ".join(f"{node}: {r.tail()}" for node, r in sorted(failed.items())),
                hint="`deploy.py logs` shows the task logs",
            )

    def _start_command(self, task: TaskSpec) -> str:
        layout = self.transport.layout(task.node)
        env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", **self.env}
        if self.spec.mode != "single":
            env["TF_CONFIG"] = tf_config_json(self.tasks, task)
        argv = trainer_argv(self.spec, self.output_dir)
        # Each script is wrapped in a subshell: one task's `exit` must not
        # skip the next task's start on the same node.
        return "(\n" + commands.start_task(layout, task.name, argv, env) + "\n)"

    def _wait_ready(self, tasks: Sequence[TaskSpec]) -> None:
        if not tasks:
            return
        by_node: dict[str, dict[str, int]] = defaultdict(dict)
        for task in tasks:
            by_node[task.node][task.name] = task.port
        scripts = {
            node: commands.wait_ports(self.transport.layout(node), ports, self.ready_timeout)
            for node, ports in by_node.items()
        }
        results = self.transport.run_all(scripts, timeout=self.ready_timeout + 30)
        problems = []
        for node, result in sorted(results.items()):
            states = facts.parse_readiness(result.stdout)
            for name in sorted(by_node[node]):
                state = states.get(name, "unknown")
                if state != "ready":
                    problems.append(f"{name} on {node} {self._why(state)}")
        if problems:
            self.stop()
            raise JobFailed(
                "; ".join(problems), hint="`deploy.py logs` shows why the tasks did not come up"
            )

    def _why(self, state: str) -> str:
        if state == "dead":
            return "exited before it listened on its port"
        if state == "timeout":
            return f"did not listen on its port within {self.ready_timeout:.0f} s"
        return "did not report"

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
                self.on_log(line)
                return
            if event.kind == "done":
                self.summary = event.get("summary")
            self.on_event(event)

        try:
            self.transport.stream(self.chief.node, commands.follow_log(layout, "chief-0"), on_line)
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
        for node, names in by_node.items():
            try:
                result = self.transport.run(
                    node, commands.task_status(self.transport.layout(node), names), timeout=30
                )
            except RemoteError:
                continue
            out.update(facts.parse_task_status(result.stdout))
        return out

    # -- stop and fetch ----------------------------------------------------------

    def stop(self, tasks: Sequence[TaskSpec] | None = None) -> list[str]:
        """Stop tasks (all by default) on every node that answers; a node
        that is gone (stopped, killed) has nothing left to stop."""
        by_node: dict[str, list[str]] = defaultdict(list)
        for task in tasks if tasks is not None else self.tasks:
            by_node[task.node].append(task.name)
        stopped: list[str] = []
        for node, names in by_node.items():
            try:
                result = self.transport.run(
                    node, commands.stop_tasks(self.transport.layout(node), names), timeout=60
                )
            except RemoteError as exc:
                log.warning("could not reach %s to stop %s: %s", node, ", ".join(names), exc)
                continue
            stopped += [line.split()[1] for line in result.stdout.splitlines() if " " in line]
        return stopped

    def fetch(self, dest: Path) -> Path:
        self.transport.fetch(self.chief.node, self.output_dir, dest)
        return dest

    def run(self, dest: Path) -> int:
        """start, follow, stop the rest, fetch; the chief's exit code.
        Ctrl-C stops every task the job started."""
        try:
            self.start()
            started = time.monotonic()
            code = self.follow()
        except KeyboardInterrupt:
            self.stop()
            raise Interrupted(
                "interrupted: every task of the job was stopped",
                hint="`deploy.py train --resume` continues from the last checkpoint",
            ) from None
        except BaseException:
            self.stop()
            raise
        self.stop([t for t in self.tasks if t is not self.chief])
        log.info("chief ended after %.0f s with exit code %s", time.monotonic() - started, code)
        try:
            self.fetch(dest)
        except RemoteError as exc:
            log.warning("could not fetch the run folder: %s", exc)
        return code if code is not None else -1
