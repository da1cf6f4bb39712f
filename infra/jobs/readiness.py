"""A job's start: waiting until its tasks listen on their TF_CONFIG ports.

Polled in short slices (``READY_POLL_S``) on all nodes at once
(``commands.wait_ports``, parsed by ``facts.parse_readiness`` and
``facts.parse_output``), so that a task that dies on one node ends the wait
everywhere at once instead of after the whole timeout, and so that each task
still waited for is reported after every poll (``Waiting``: its last lines
of output and the seconds waited) for a front end's live line of it. A task
that dies, or none that listens in time (``TFCLUSTER_READY_WAIT``, 240 s),
fails the job with the end of its log; what the job started is stopped.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from infra.errors import ConfigError, JobFailed, RemoteError
from infra.jobs import failure
from infra.node import commands, facts
from infra.spec.tfconfig import TaskSpec
from infra.transport.base import Transport

# Seconds of one readiness poll: how late a death on another node is seen,
# and how often a task still waited for has its output reported.
READY_POLL_S = 2.0
# How long the tasks have to listen on their ports: TFCLUSTER_READY_WAIT.
READY_WAIT_ENV = "TFCLUSTER_READY_WAIT"
DEFAULT_READY_WAIT_S = 240.0


def ready_wait() -> float:
    """Seconds a job's tasks have to listen: TFCLUSTER_READY_WAIT, else 240."""
    text = os.environ.get(READY_WAIT_ENV)
    if not text:
        return DEFAULT_READY_WAIT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e6:
        raise ConfigError(
            f"{READY_WAIT_ENV}={text[:60]!r}: not a number of seconds; "
            f"set e.g. {READY_WAIT_ENV}=600"
        )
    return value


@dataclass(frozen=True)
class Waiting:
    """A task that does not listen on its port yet, as a readiness poll
    saw it: its last lines of output (node text) and how many of them are
    new since the poll before."""

    task: str
    node: str
    port: int
    seconds: float  # since the wait began
    lines: tuple[str, ...] = ()
    new: int = 0

    @property
    def new_lines(self) -> tuple[str, ...]:
        return self.lines[len(self.lines) - self.new :] if self.new else ()


class Starting(Protocol):
    """What the wait reads of the job that starts (``infra/jobs/job.py``'s
    ``Job``, which calls it): its transport, the tasks it started (stopped
    when the wait fails), its patience and its reports."""

    transport: Transport
    started: list[TaskSpec]
    ready_timeout: float | None
    on_waiting: Callable[[list[Waiting]], None]

    def status(self) -> dict[str, facts.TaskStatus]: ...

    def failure_details(self, tasks: Sequence[TaskSpec]) -> list[str]: ...

    def stop(self, tasks: Sequence[TaskSpec] | None = None) -> list[str]: ...


def wait_ready(job: Starting, tasks: Sequence[TaskSpec]) -> None:
    """Wait until every task listens on its port. Polled in short slices
    on all nodes at once, so that a task that dies on one node ends the
    wait everywhere at once instead of after the whole timeout."""
    if not tasks:
        return
    began = time.monotonic()
    deadline = began + (job.ready_timeout or ready_wait())
    pending = list(tasks)
    states: dict[str, str] = {}
    shown: dict[str, int] = {}  # each task's lines of output reported so far
    try:
        _poll(job, tasks, pending, states, shown, began, deadline)
    finally:
        job.on_waiting([])
    _check(job, tasks, states)


def _poll(
    job: Starting,
    tasks: Sequence[TaskSpec],
    pending: list[TaskSpec],
    states: dict[str, str],
    shown: dict[str, int],
    began: float,
    deadline: float,
) -> None:
    """Poll until every task listens, one dies, or the deadline; after
    each poll, the tasks still waited for and their output so far."""
    while pending:
        by_node: dict[str, dict[str, int]] = defaultdict(dict)
        for task in pending:
            by_node[task.node][task.name] = task.port
        poll = max(1.0, min(READY_POLL_S, deadline - time.monotonic()))
        scripts = {
            node: commands.wait_ports(job.transport.layout(node), ports, poll)
            for node, ports in by_node.items()
        }
        try:
            results = job.transport.run_all(scripts, timeout=poll + 30, in_task_network=True)
        except RemoteError:
            job.stop(job.started)
            raise
        output: dict[str, tuple[int, list[str]]] = {}
        for result in results.values():
            states.update(facts.parse_readiness(result.stdout))
            output.update(facts.parse_output(result.stdout))
        pending[:] = [t for t in pending if states.get(t.name) == "timeout"]
        if any(states.get(t.name) not in ("ready", "timeout") for t in tasks):
            break  # dead (or unreadable): the job cannot start
        job.on_waiting([_waiting(t, output, shown, began) for t in pending])
        if time.monotonic() >= deadline:
            break


def _waiting(
    task: TaskSpec,
    output: Mapping[str, tuple[int, list[str]]],
    shown: dict[str, int],
    began: float,
) -> Waiting:
    count, lines = output.get(task.name, (shown.get(task.name, 0), []))
    new = min(max(count - shown.get(task.name, 0), 0), len(lines))
    shown[task.name] = count
    return Waiting(task.name, task.node, task.port, time.monotonic() - began,
                   tuple(lines), new)  # fmt: skip


def _check(job: Starting, tasks: Sequence[TaskSpec], states: Mapping[str, str]) -> None:
    """Raise JobFailed (after stopping what this job started) unless
    every task listens: the dead ones blamed, or those that did not."""
    problems: list[str] = []
    dead: list[TaskSpec] = []
    for task in sorted(tasks, key=lambda t: (t.node, t.name)):
        if states.get(task.name) == "dead":
            dead.append(task)
    for task in sorted(tasks, key=lambda t: (t.node, t.name)):
        state = states.get(task.name, "unknown")
        # Once a task died, the others' wait was cut short: only the
        # dead ones are the cause.
        if state != "ready" and (state == "dead" or not dead):
            problems.append(f"{task.name} on {task.node} {_why(job, state)}")
    if problems:
        # The dead tasks' logs, or (none died) those of the tasks that
        # did not come up: a hang at start says where it hangs.
        blamed = dead or [t for t in tasks if states.get(t.name) != "ready"]
        try:
            codes = job.status()
            details = job.failure_details(blamed)
        finally:  # a changed host key (raised) must not leave tasks running
            job.stop(job.started)
        exits = [s.exit_code for t in dead if (s := codes.get(t.name)) and s.exit_code]
        exit_code = exits[0] if exits else None
        raise JobFailed(
            "; ".join(problems) + (f" (exit code {exit_code})" if exit_code is not None else ""),
            exit_code=exit_code or 9,
            hint=failure.strategy_hint(details)
            or "`deploy.py logs` shows why the tasks did not come up",
            details=details,
        )


def _why(job: Starting, state: str) -> str:
    if state == "dead":
        return "exited before it listened on its port"
    if state == "timeout":
        return f"did not listen on its port within {job.ready_timeout or 0:.0f} s"
    return "did not report"
