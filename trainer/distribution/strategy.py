"""The one strategy factory: TF_CONFIG -> this task's role -> tf.distribute strategy.

Like TF Model Garden's ``distribute_utils``, every mode gets its strategy
here and nowhere else: its catalog entry names one of the kinds of
``create_strategy``. Which tasks take part per mode is in
``trainer/catalog.py``, which ``infra/spec/tfconfig.py`` (the cluster builder)
follows:

* ``async``: chief + ps + worker. ps and workers only run a
  ``tf.distribute.Server`` and block; the chief runs the program with
  ``ParameterServerStrategy`` and a ``ClusterCoordinator`` that schedules
  steps onto the workers.
* ``sync``: chief + worker, all running the program under
  ``MultiWorkerMirroredStrategy`` (gradients all-reduced every step).
* ``average``: chief + worker, all running the program; each trains a local
  replica and ``MultiWorkerMirroredStrategy`` is used only for its
  collectives (the periodic parameter average).
* ``ensemble``: chief + worker, each training a model of its own
  (``trainer/modes/ensemble.py``); the strategy's collectives only gather the
  members' test predictions at the end.
* ``single``: one process; ``MirroredStrategy`` over every local GPU when
  it has any (one GPU too: its input pipeline then prefetches the batches
  onto the GPU), else the default strategy.

``MultiWorkerMirroredStrategy`` (sync, average) takes every local GPU of
its task by itself, and both mirrored strategies' distributed datasets
prefetch each replica's batches to its device.

TF_CONFIG parsing is plain Python (TensorFlow is imported only when a
strategy or server is made), so it is cheap to test and to use in error paths.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, NoReturn

from trainer import catalog
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
    """Refuse a cluster the mode's strategy cannot use, with the reason. The
    catalog says which task types a mode wants: with ps tasks, every type
    must be there; with workers but no ps, the workers meet in all-reduce
    collectives, which a ps would break; the chief alone, one process."""
    entry = catalog.mode(mode)
    if entry.needs_ps:
        if not info.cluster:
            wanted = [_A_TASK[t] for t in entry.task_types]
            raise ClusterError(
                f"mode {mode} needs TF_CONFIG with {', '.join(wanted[:-1])} and {wanted[-1]}"
            )
        missing = [t for t in entry.task_types if not info.count(t)]
        if missing:
            raise ClusterError(f"mode {mode} needs {' and '.join(missing)} task(s) in TF_CONFIG")
    elif entry.needs_workers:
        if info.num_ps:
            collective = entry.strategy == catalog.COLLECTIVE
            uses = "uses all-reduce collectives" if collective else "runs no ps"
            raise ClusterError(f"mode {mode} {uses}: TF_CONFIG must not list a ps")
    elif info.cluster and info.count("chief") + info.count("worker") > 1:
        raise ClusterError(f"mode {mode} runs one process, but TF_CONFIG lists several")


# How an error message asks for a task type.
_A_TASK = {"chief": "a chief", "ps": "a ps", "worker": "workers"}


def num_workers(info: ClusterInfo, mode: str) -> int:
    """Processes that compute gradients: the workers where they only serve
    (async: the chief only coordinates), else every chief and worker."""
    entry = catalog.mode(mode)
    if entry.workers_serve:
        return info.count("worker")
    if not entry.needs_workers or not info.cluster:
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
    return catalog.mode(mode).workers_serve and info.task_type in ("ps", "worker")


def server_module() -> ModuleType:
    """TensorFlow's gRPC server module (``server_lib``: ``Server``,
    ``ClusterSpec``), for a task that only serves.

    ``import tensorflow`` runs TensorFlow's whole Python API into being, and
    Keras and matplotlib with it (its eager import of Keras' optimizers):
    4.2 s of CPU measured here, paid by every ps and worker while a job
    starts, on the cores the chief needs for the same import. A serving
    task runs no Python of TensorFlow's past the server: what it executes
    comes from the chief as graphs, run by the C++ runtime that server_lib
    loads (every kernel of the core library). So the package is entered
    without its ``__init__``: 0.6 s of CPU. Where TensorFlow's ``__init__``
    would also load kernels of other libraries (a ``core/kernels`` folder,
    ``tensorflow-plugins``), or the short way fails, the whole import."""
    if "tensorflow" not in sys.modules:
        spec = importlib.util.find_spec("tensorflow")
        folders = list(spec.submodule_search_locations or []) if spec else []
        if spec is not None and folders and not _extra_kernels(folders):
            package = ModuleType("tensorflow")
            package.__path__ = folders
            package.__spec__ = spec
            package.__file__ = spec.origin
            sys.modules["tensorflow"] = package
            try:
                from tensorflow.python.training import server_lib

                return server_lib
            except Exception:  # any failure: the whole import instead
                for name in [n for n in sys.modules if n.split(".")[0] == "tensorflow"]:
                    del sys.modules[name]
    import tensorflow  # noqa: F401
    from tensorflow.python.training import server_lib

    return server_lib


def _extra_kernels(folders: list[str]) -> bool:
    """Whether ``import tensorflow`` would load kernel libraries of its own
    (tensorflow/__init__.py: core/kernels, site-packages' tensorflow-plugins)."""
    plugins = [Path(p) / "tensorflow-plugins" for p in sys.path if "site-packages" in p]
    return any((Path(f) / "core" / "kernels").exists() for f in folders) or any(
        p.exists() for p in plugins
    )


def serve(info: ClusterInfo) -> NoReturn:
    """Run this task's gRPC server until the process is killed (the job
    stops ps and workers when the chief has finished)."""
    server_lib = server_module()
    try:
        rpc_layer = json.loads(os.environ.get("TF_CONFIG") or "{}").get("rpc_layer")
    except (json.JSONDecodeError, AttributeError):
        rpc_layer = None
    server = server_lib.Server(
        server_lib.ClusterSpec({kind: list(tasks) for kind, tasks in info.cluster.items()}),
        job_name=info.task_type,
        task_index=info.task_index,
        protocol=rpc_layer or "grpc",
        start=True,
    )
    print(f"trainer: {info.name} serving at {server.target}", flush=True)
    server.join()
    raise ClusterError(f"{info.name}: server stopped")


def wait_for_servers(info: ClusterInfo, timeout: float) -> None:
    """Wait until every ps and worker of the cluster accepts connections on
    its port (a ParameterServerStrategy made before that fails to connect).
    The orchestrator starts an async chief together with its ps and
    workers and watches them itself: a task that dies ends the job there."""
    pending = [a for kind in ("ps", "worker") for a in info.cluster.get(kind, ())]
    deadline = time.monotonic() + timeout
    while pending:
        pending = [a for a in pending if not listens(a)]
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise ClusterError(f"{', '.join(pending)} did not listen within {timeout:.0f} s")
        time.sleep(0.05)


def listens(address: str) -> bool:
    """Whether something accepts connections at ``address`` (host:port)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def connect_to_cluster() -> None:
    """Make every task of TF_CONFIG a device of this process (nothing
    without a cluster): ``tf.device("/job:worker/replica:0/task:1")`` then
    runs there. Each worker sees only the chief and the other workers
    (device filters): without them, connecting hung here, each worker
    waiting to reach every task of the cluster first."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    if not spec.jobs:
        return
    filters = tf.config.experimental.ClusterDeviceFilters()
    for index in range(len(spec.as_dict().get("worker", ()))):
        filters.set_device_filters("worker", index, ["/job:chief", "/job:worker"])
    tf.config.experimental_connect_to_cluster(
        spec,
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        cluster_device_filters=filters,
    )


def create_strategy(kind: str) -> tf.distribute.Strategy:
    """The strategy of ``kind`` (``catalog.STRATEGIES``: a mode's catalog
    entry names its kind). Call it before any other TensorFlow op:
    MultiWorkerMirroredStrategy configures the collective runtime, which must
    happen before the eager context is initialised."""
    import tensorflow as tf

    if kind == catalog.PARAMETER_SERVER:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.ParameterServerStrategy(resolver)
    if kind == catalog.COLLECTIVE:
        # ensemble: only for the final gather of the members' predictions.
        return tf.distribute.MultiWorkerMirroredStrategy()
    if kind == catalog.REMOTE:
        connect_to_cluster()
        return tf.distribute.get_strategy()
    if kind != catalog.LOCAL:
        raise ValueError(f"unknown kind of strategy {kind!r}; expected {catalog.STRATEGIES}")
    if tf.config.list_physical_devices("GPU"):
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()
