"""Jobs of real ``python -m trainer`` processes on loopback, without a cluster.

One process per task, TF_CONFIGs from infra/spec/tfconfig.py, free ports, logs
in files, each task pinned to CPUs of its own if asked, and ``stop()`` that
always kills what it started. No state, no sync, no transport: what the
trainer's tests and bench/trainer.py measure is the trainer alone (the
local provider, by contrast, is a whole cluster on this machine).

Scaffolding for measuring, not part of the library (a folder of its own, so
that `make bench`, which runs every ``bench/*.py``, does not run it; the
trainer's tests use it too, through tests/trainer/cluster.py).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.jobs.protocol import ProgressEvent, parse_line
from infra.spec.tfconfig import TaskSpec, build_tasks, tf_config_json
from trainer import catalog

# The checkout whose trainer/ the tasks run.
REPO = Path(__file__).resolve().parents[2]


def free_ports(count: int) -> list[int]:
    """Ports nobody listens on now (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def task_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra or {})
    return env


def _pin(cpus: set[int] | None) -> Callable[[], None] | None:
    """A preexec_fn that pins the child to ``cpus`` before TensorFlow sizes
    its thread pools (it counts the CPUs it may run on)."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


@dataclass
class LocalJob:
    """One job: ``mode`` with ``workers`` workers (where the chief trains
    too, sync and average: the chief counts as one) and ``ps`` parameter
    servers."""

    mode: str
    argv: Sequence[str]
    log_dir: Path
    workers: int = 1
    ps: int = 0
    env: dict[str, str] = field(default_factory=dict)
    # Task name (ps-0, worker-1, chief-0) -> the CPUs it may run on; unset: all.
    cpus: Mapping[str, set[int]] = field(default_factory=dict)
    # Another program for every task, on the same cluster as ``mode``'s
    # (python's arguments: a script, then ``argv``); unset: the trainer.
    program: Sequence[str] = ()
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    tasks: list[TaskSpec] = field(default_factory=list)

    def _roles(self) -> dict[str, list[str]]:
        entry = catalog.mode(self.mode)
        if not entry.needs_workers:
            return {"chief": ["c"]}
        # Where the workers only serve, the chief is none of them.
        workers = self.workers if entry.workers_serve else self.workers - 1
        roles = {"worker": [f"w{i}" for i in range(workers)], "chief": ["c"]}
        if entry.needs_ps:
            roles["ps"] = [f"ps{i}" for i in range(self.ps)]
        return roles

    def start(self) -> LocalJob:
        roles = self._roles()
        nodes = [n for names in roles.values() for n in names]
        ports = dict(zip(nodes, free_ports(len(nodes)), strict=True))
        self.tasks = build_tasks(
            catalog.mode(self.mode).task_types,
            roles,
            dict.fromkeys(nodes, "localhost"),
            lambda node, t, i: ports[node],
        )
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for task in self.tasks:  # ps, workers, then the chief
            env = task_env(self.env)
            if catalog.mode(self.mode).needs_workers:
                env["TF_CONFIG"] = tf_config_json(self.tasks, task)
            log = (self.log_dir / f"{task.name}.log").open("wb")
            command = list(self.program) or ["-m", "trainer", "--mode", self.mode]
            self.processes[task.name] = subprocess.Popen(
                [sys.executable, *command, *self.argv],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_pin(self.cpus.get(task.name)),
            )
            log.close()
        return self

    def wait(self, timeout: float) -> int:
        """The chief's exit code (raises TimeoutError, with the logs)."""
        try:
            return self.processes["chief-0"].wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"chief still running after {timeout}s\n{self.logs()}") from None

    def kill(self, name: str) -> None:
        process = self.processes[name]
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for process in self.processes.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def log(self, name: str = "chief-0") -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self, tail: int = 40) -> str:
        parts = []
        for name in self.processes:
            lines = self.log(name).splitlines()[-tail:]
            parts.append(f"--- {name} ---\n" + "\n".join(lines))
        return "\n".join(parts)

    def events(self, name: str = "chief-0") -> list[ProgressEvent]:
        return [e for e in map(parse_line, self.log(name).splitlines()) if e is not None]

    def wait_for_event(self, kind: str, timeout: float, **match: Any) -> ProgressEvent:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events():
                if event.kind == kind and all(event.get(k) == v for k, v in match.items()):
                    return event
            if self.processes["chief-0"].poll() is not None:
                break
            time.sleep(0.2)
        raise TimeoutError(f"no {kind} event {match or ''}\n{self.logs()}")


@contextmanager
def local_job(
    mode: str,
    argv: Sequence[str],
    log_dir: Path,
    *,
    workers: int = 1,
    ps: int = 0,
    env: dict[str, str] | None = None,
) -> Iterator[LocalJob]:
    """A started job whose processes are killed on exit, pass or fail."""
    job = LocalJob(mode=mode, argv=argv, log_dir=log_dir, workers=workers, ps=ps, env=env or {})
    try:
        yield job.start()
    finally:
        job.stop()


def read_summary(output_dir: Path) -> dict[str, Any]:
    return json.loads((output_dir / "summary.json").read_text())
