"""The one strategy factory: TF_CONFIG -> this task's role -> tf.distribute strategy.

Like TF Model Garden's ``distribute_utils``, every mode gets its strategy
here and nowhere else. Which tasks take part per mode is fixed by
``infra/tfconfig.py`` (the cluster builder):

* ``async``: chief + ps + worker. ps and workers only run a
  ``tf.distribute.Server`` and block; the chief runs the program with
  ``ParameterServerStrategy`` and a ``ClusterCoordinator`` that schedules
  steps onto the workers.
* ``sync``: chief + worker, all running the program under
  ``MultiWorkerMirroredStrategy`` (gradients all-reduced every step).
* ``average``: chief + worker, all running the program; each trains a local
  replica and ``MultiWorkerMirroredStrategy`` is used only for its
  collectives (the periodic parameter average).
* ``single``: one process; ``MirroredStrategy`` over the local GPUs when
  there are several, else the default strategy.

TF_CONFIG parsing is plain Python (TensorFlow is imported only when a
strategy or server is made), so it is cheap to test and to use in error paths.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from trainer.errors import ClusterError

if TYPE_CHECKING:
    import tensorflow as tf

TASK_TYPES = ("chief", "ps", "worker")


@dataclass(frozen=True)
class ClusterInfo:
    """This process's view of TF_CONFIG. No TF_CONFIG: an empty cluster and a
    task that is its own chief."""

    cluster: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    task_type: str = "chief"
    task_index: int = 0

    @property
    def is_chief(self) -> bool:
        # A chief task is the chief even without a cluster (no TF_CONFIG).
        return self.task_type == "chief" or self.name == self.chief_name

    @property
    def num_ps(self) -> int:
        return len(self.cluster.get("ps", ()))

    def count(self, task_type: str) -> int:
        return len(self.cluster.get(task_type, ()))

    @property
    def name(self) -> str:
        return f"{self.task_type}-{self.task_index}"

    @property
    def chief_name(self) -> str:
        # TF's rule: the chief task, or worker 0 of a cluster without one.
        return "chief-0" if "chief" in self.cluster else "worker-0"

    def training_tasks(self) -> list[str]:
        """Names of the tasks that train (chief and workers; not ps)."""
        return [
            f"{kind}-{index}" for kind in ("chief", "worker") for index in range(self.count(kind))
        ]


def parse_tf_config(text: str | None) -> ClusterInfo:
    """Parse a TF_CONFIG value (None or empty: single process)."""
    if not text or not text.strip():
        return ClusterInfo()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ClusterError(f"TF_CONFIG is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ClusterError("TF_CONFIG must be a JSON object with 'cluster' and 'task'")
    raw_cluster = data.get("cluster") or {}
    task = data.get("task") or {}
    if not isinstance(raw_cluster, dict) or not isinstance(task, dict):
        raise ClusterError("TF_CONFIG 'cluster' and 'task' must be objects")
    cluster: dict[str, tuple[str, ...]] = {}
    for task_type, addresses in raw_cluster.items():
        if task_type not in TASK_TYPES:
            raise ClusterError(
                f"TF_CONFIG cluster has task type {task_type!r}; expected {', '.join(TASK_TYPES)}"
            )
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise ClusterError(f"TF_CONFIG cluster.{task_type} must be a list of host:port")
        cluster[task_type] = tuple(addresses)
    if not cluster:
        return ClusterInfo()
    task_type = task.get("type")
    task_index = task.get("index", 0)
    if task_type not in cluster:
        raise ClusterError(f"TF_CONFIG task type {task_type!r} is not in its cluster")
    if not isinstance(task_index, int) or not 0 <= task_index < len(cluster[task_type]):
        raise ClusterError(
            f"TF_CONFIG task index {task_index!r} out of range for {len(cluster[task_type])} "
            f"{task_type} task(s)"
        )
    if len(cluster.get("chief", ())) > 1:
        raise ClusterError("TF_CONFIG cluster has more than one chief")
    return ClusterInfo(cluster=cluster, task_type=task_type, task_index=task_index)


def check_mode(info: ClusterInfo, mode: str) -> None:
    """Refuse a cluster the mode's strategy cannot use, with the reason."""
    if mode == "async":
        if not info.cluster:
            raise ClusterError("mode async needs TF_CONFIG with a chief, a ps and workers")
        missing = [t for t in TASK_TYPES if not info.count(t)]
        if missing:
            raise ClusterError(f"mode async needs {' and '.join(missing)} task(s) in TF_CONFIG")
    elif mode in ("sync", "average"):
        if info.num_ps:
            raise ClusterError(
                f"mode {mode} uses all-reduce collectives: TF_CONFIG must not list a ps"
            )
    elif mode == "single" and info.cluster and info.count("chief") + info.count("worker") > 1:
        raise ClusterError("mode single runs one process, but TF_CONFIG lists several")


def num_workers(info: ClusterInfo, mode: str) -> int:
    """Processes that compute gradients: the workers in async mode (the chief
    only coordinates), every chief and worker in sync/average mode."""
    if mode == "async":
        return info.count("worker")
    if mode == "single" or not info.cluster:
        return 1
    return info.count("chief") + info.count("worker")


def worker_index(info: ClusterInfo) -> int:
    """Position of this process among the training processes of a collective
    mode: the chief is 0, worker i is i + 1 (MWMS's own task order)."""
    if info.task_type == "worker":
        return info.task_index + (1 if info.count("chief") else 0)
    return 0


def serves_only(info: ClusterInfo, mode: str) -> bool:
    """Whether this task only serves (async ps and workers)."""
    return mode == "async" and info.task_type in ("ps", "worker")


def serve(info: ClusterInfo) -> NoReturn:
    """Run this task's gRPC server until the process is killed (the job
    stops ps and workers when the chief has finished)."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=info.task_type,
        task_index=info.task_index,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    print(f"trainer: {info.name} serving at {server.target}", flush=True)
    server.join()
    raise ClusterError(f"{info.name}: server stopped")


def create_strategy(mode: str, info: ClusterInfo) -> tf.distribute.Strategy:
    """The strategy for ``mode``. Call it before any other TensorFlow op:
    MultiWorkerMirroredStrategy configures the collective runtime, which must
    happen before the eager context is initialised."""
    import tensorflow as tf

    if mode == "async":
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.ParameterServerStrategy(resolver)
    if mode in ("sync", "average"):
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()
