"""What a job is, apart from running it: the program every task runs
(``Program``; ``trainer_program`` for the built-in trainer), the job to
launch (``JobSpec``: a run id and its program), run ids and labels, and
``JobRecord``, the job as the state file remembers it.

A record is read back from ``~/.tfcluster``, a file that may be torn or
edited: ``JobRecord.from_dict`` refuses what is partial, of the wrong
types, or a run id or node name that could climb out of the run folder.
infra/jobs/job.py runs a job; this module needs no transport.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

from infra.spec.tfconfig import TaskSpec
from trainer import catalog

# The exit code recorded for a job stopped by `deploy.py cancel` (as a shell
# records a process ended by SIGINT).
CANCELLED = 130


@dataclass(frozen=True)
class Program:
    """What every task of a job runs, and where.

    ``argv`` is run as it is (never through a shell), its ``argv[0]`` looked
    up on a PATH that starts with the node environment's bin (``python`` is
    the one with TensorFlow). ``task_types`` says which TF task types take
    part. A user's program runs in the synced working folder
    (``in_workdir``); the built-in trainer runs from the login's home with
    the synced tfcluster code on PYTHONPATH (``builtin``)."""

    argv: tuple[str, ...]
    task_types: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    in_workdir: bool = True
    builtin: bool = False
    # The chief waits until the other tasks listen (the built-in trainer's
    # async chief): it may start with them, importing TensorFlow meanwhile.
    chief_waits: bool = False


def trainer_program(
    *,
    model: str,
    mode: str,
    steps: int | None,
    batch_size: int,
    checkpoint_every: int,
    learning_rate: float | None = None,
    data_dir: str | None = None,
    extra_args: Sequence[str] = (),
    resume: bool = False,
) -> Program:
    """The built-in trainer as a program: ``python -m trainer`` with the
    same flags on every task (each reads its role from TF_CONFIG, and its
    run folder from TFCLUSTER_RUN_DIR). ``steps`` None: the trainer flags
    in ``extra_args`` say how long (``--epochs``)."""
    argv = [
        "python", "-m", "trainer",
        "--model", model,
        "--mode", mode,
        *(["--steps", str(steps)] if steps is not None else []),
        "--batch-size", str(batch_size),
        "--checkpoint-every", str(checkpoint_every),
    ]  # fmt: skip
    if learning_rate is not None:
        argv += ["--learning-rate", repr(learning_rate)]
    if data_dir:
        argv += ["--data-dir", data_dir]
    if resume:
        argv.append("--resume")
    argv += list(extra_args)
    return Program(
        argv=tuple(argv),
        task_types=catalog.mode(mode).task_types,
        in_workdir=False,
        builtin=True,
        chief_waits=catalog.mode(mode).workers_serve,
    )


@dataclass(frozen=True)
class JobSpec:
    """One job: its id and its program; for the built-in trainer also the
    model and mode (``train --resume`` checks them)."""

    run_id: str
    program: Program
    model: str | None = None
    mode: str | None = None
    resume: bool = False
    # Lines about the job to show before it starts: the Keras its tf.keras
    # was given, how ``--mode layers`` splits the model, a ps it does not use.
    notes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return job_label(self.model, self.mode, self.program.argv)


def job_label(model: str | None, mode: str | None, argv: Sequence[str]) -> str:
    """How a job is named to the user: the built-in trainer's model and
    mode, else the program's command line."""
    return f"{model}, {mode}" if model and mode else " ".join(argv)


_RUN_ID_WORD = re.compile(r"[^a-z0-9]+")


def new_run_id(name: str, now: datetime | None = None) -> str:
    """``<name>-<UTC time>``, name reduced to lowercase letters, digits and
    '-' (a run id names folders here and on the nodes)."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    word = _RUN_ID_WORD.sub("-", name.lower()).strip("-")[:40] or "run"
    return f"{word}-{stamp}"


def program_name(argv: Sequence[str]) -> str:
    """A short name for a user's command, for its run id: the script of
    ``python train.py`` or ``python -m pkg.train``, else the command."""
    for i, arg in enumerate(argv):
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1].rsplit(".", 1)[-1]
        if arg.endswith(".py"):
            return PurePosixPath(arg).stem
    return PurePosixPath(argv[0]).name if argv else "run"


# A run id as new_run_id makes it; a node name as cluster.yaml allows one.
_SAFE_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,80}\Z")
_SAFE_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
_TASK_FIELDS = {"type", "index", "node", "host", "port"}


def is_run_id(text: str) -> bool:
    """Whether ``text`` can be a run id: it names folders here and on the
    nodes, so nothing that climbs out of them."""
    return bool(_SAFE_RUN_ID.match(text))


def _is_int(value: Any, *, none: bool = False) -> bool:
    return (value is None and none) or (isinstance(value, int) and not isinstance(value, bool))


def _is_task(task: Any) -> bool:
    """A task record as JobRecord.tasks holds it (TaskSpec's fields)."""
    return (
        isinstance(task, dict)
        and set(task) == _TASK_FIELDS
        and task["type"] in ("chief", "ps", "worker")
        and _is_int(task["index"])
        and 0 <= task["index"] < 10_000
        and isinstance(task["node"], str)
        and bool(_SAFE_NODE.match(task["node"]))
        and isinstance(task["host"], str)
        and _is_int(task["port"])
        and 0 < task["port"] < 65536
    )


@dataclass
class JobRecord:
    """What the state file remembers of the last job (for logs, fetch,
    cancel, --resume and --detach)."""

    run_id: str
    chief_node: str
    output_dir: str  # on the chief node
    tasks: list[dict[str, Any]] = field(default_factory=list)
    started_at: str = ""
    exit_code: int | None = None
    command: list[str] = field(default_factory=list)
    model: str | None = None
    mode: str | None = None
    # `deploy.py cancel` asked for its end: a recovery does not restart it.
    cancelled: bool = False

    @classmethod
    def from_dict(cls, data: Any) -> JobRecord:
        """The record the state file holds; ValueError (naming the field)
        when it is partial or of the wrong types, so that a torn or edited
        file means "no last job", never a crash in a later command."""
        if not isinstance(data, dict):
            raise ValueError("not an object")
        for name in ("run_id", "chief_node", "output_dir"):
            if not isinstance(data.get(name), str) or not data[name]:
                raise ValueError(f"{name} missing or not text")
        if not _SAFE_RUN_ID.match(data["run_id"]):
            # It names folders here and on the nodes: nothing that climbs out.
            raise ValueError(f"run_id {data['run_id'][:60]!r} is not a run id")
        out = PurePosixPath(data["output_dir"])
        if out.name != data["run_id"] or ".." in out.parts:
            raise ValueError(f"output_dir {data['output_dir'][:60]!r} is not the run's folder")
        for name in ("started_at", "model", "mode"):
            if name in data and not isinstance(data[name], str | None):
                raise ValueError(f"{name} is not text")
        if not isinstance(data.get("cancelled", False), bool):
            raise ValueError("cancelled is not true or false")
        if not _is_int(data.get("exit_code"), none=True):
            raise ValueError("exit_code is not a number")
        command = data.get("command", [])
        if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
            raise ValueError("command is not a list of words")
        tasks = data.get("tasks", [])
        if not isinstance(tasks, list) or not all(_is_task(t) for t in tasks):
            raise ValueError("tasks is not a list of tasks")
        if sum(t["type"] == "chief" for t in tasks) != 1:
            raise ValueError("tasks has no single chief")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def task_specs(self) -> list[TaskSpec]:
        return [TaskSpec(**t) for t in self.tasks]

    @property
    def label(self) -> str:
        return job_label(self.model, self.mode, self.command)
