"""The one TF_CONFIG builder: which tasks a job has, where they listen, and
the TF_CONFIG each of them is started with.

TensorFlow's cluster resolver reads ``TF_CONFIG`` (``cluster`` maps task types
to ``host:port`` lists, ``task`` names this process); it is the same contract
as Vertex AI's custom training jobs, so a program written from TensorFlow's
distributed-training guides runs unchanged. Which task types take part is the
program's business: a parameter-server program wants ``chief`` + ``ps`` +
``worker`` (the ps and workers only serve, the chief schedules); a collective
one (MultiWorkerMirroredStrategy) ``chief`` + ``worker`` and no ``ps``, which
the strategy would refuse; a one-process program the ``chief`` alone. The
built-in trainer's modes say which in ``trainer/catalog.py``.

Addresses are the nodes' *internal* addresses: the tasks talk to each other
on the cluster's private network, never through the external IPs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

TASK_TYPES = ("chief", "ps", "worker")
ROLE_ORDER = TASK_TYPES


@dataclass(frozen=True)
class TaskSpec:
    """One TensorFlow task of a job: a process on a node."""

    type: str  # "chief" | "ps" | "worker"
    index: int  # index within its type, as TF_CONFIG's task.index
    node: str  # the cluster node it runs on (pc-1 ...)
    host: str  # internal address the other tasks reach it at
    port: int  # gRPC port it listens on

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def name(self) -> str:
        """Short stable name, used for pid and log files: ``worker-1``."""
        return f"{self.type}-{self.index}"


PortFor = Callable[[str, str, int], int]
"""``port_for(node, task_type, index) -> port``: where a task listens."""


def build_tasks(
    task_types: Sequence[str],
    roles: Mapping[str, Sequence[str]],
    internal_addresses: Mapping[str, str],
    port_for: PortFor,
) -> list[TaskSpec]:
    """The tasks of a job in start order (ps, workers, then the chief), for
    the ``task_types`` that take part.

    ``roles`` maps a task type to its nodes in index order (``worker: [pc-2,
    pc-3]`` gives worker-0 on pc-2, worker-1 on pc-3); ``internal_addresses``
    maps every node that has a task to the address its peers use.
    """
    if unknown := set(task_types) - set(TASK_TYPES):
        raise ValueError(f"unknown task type {sorted(unknown)[0]!r}; TF knows {TASK_TYPES}")
    tasks: list[TaskSpec] = []
    for task_type in ("ps", "worker", "chief"):
        if task_type not in task_types:
            continue
        nodes = list(roles.get(task_type, ()))
        if task_type == "chief" and len(nodes) != 1:
            raise ValueError(f"a job needs exactly one chief, got {len(nodes)}")
        if task_type in ("ps", "worker") and not nodes:
            raise ValueError(f"the job needs at least one {task_type} node (roles.{task_type})")
        for index, node in enumerate(nodes):
            if node not in internal_addresses:
                raise ValueError(f"no internal address known for node {node!r}")
            tasks.append(
                TaskSpec(
                    type=task_type,
                    index=index,
                    node=node,
                    host=internal_addresses[node],
                    port=port_for(node, task_type, index),
                )
            )
    seen: dict[str, TaskSpec] = {}
    for task in tasks:
        other = seen.get(task.address)
        if other is not None:
            raise ValueError(
                f"{task.name} and {other.name} would both listen on {task.address}; "
                "give the roles different ports"
            )
        seen[task.address] = task
    return tasks


def cluster_spec(tasks: Sequence[TaskSpec]) -> dict[str, list[str]]:
    """TF_CONFIG's ``cluster``: task type -> addresses in index order."""
    spec: dict[str, list[str]] = {}
    for task in sorted(tasks, key=lambda t: (ROLE_ORDER.index(t.type), t.index)):
        spec.setdefault(task.type, []).append(task.address)
    return spec


def tf_config(tasks: Sequence[TaskSpec], task: TaskSpec) -> dict[str, object]:
    """The TF_CONFIG dict that ``task`` is started with."""
    return {"cluster": cluster_spec(tasks), "task": {"type": task.type, "index": task.index}}


def tf_config_json(tasks: Sequence[TaskSpec], task: TaskSpec) -> str:
    return json.dumps(tf_config(tasks, task), separators=(",", ":"), sort_keys=True)
