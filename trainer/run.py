"""What this process does: serve (async ps and workers) or train.

TensorFlow is imported only once the role is known and the dataset found,
so a bad TF_CONFIG or a missing MNIST fails in a second, not after the
TensorFlow import.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from trainer import catalog
from trainer.data.mnist import resolve_data_dir
from trainer.distribution import strategy as distribute
from trainer.errors import ClusterError
from trainer.flags import Config
from trainer.imports import import_tensorflow
from trainer.loop.progress import Progress, Startup

# How long an async chief waits for its ps and workers to listen: longer
# than the orchestrator's own wait (240 s), which stops the job first.
READY_TIMEOUT_S = 300.0


def run(config: Config, progress: Progress) -> None:
    info = distribute.parse_tf_config(os.environ.get("TF_CONFIG"))
    distribute.check_mode(info, config.mode)
    if config.require_gpu:
        # Before anything slow: a node that cannot use its GPU says so at once.
        from trainer.distribution.accelerators import check_gpus

        check_gpus(required=True)
    if distribute.serves_only(info, config.mode):
        if info.task_type == "worker":
            # Async workers run the input pipelines, which read MNIST from
            # this node's disk (at the path the chief resolved, the same on
            # nodes with the same user and flags): make sure it is here.
            resolve_data_dir(config.data_dir)
        distribute.serve(info)
    startup = Startup.from_env(progress)
    data_dir = resolve_data_dir(config.data_dir)
    tf = import_tensorflow()
    startup.mark("tensorflow")
    mode = catalog.mode(config.mode)
    if mode.workers_serve:
        # Started together with its ps and workers (TensorFlow imported
        # meanwhile, each on its own), the chief connects once they listen.
        distribute.wait_for_servers(info, READY_TIMEOUT_S)
        startup.mark("ready")
    if mode.strategy == catalog.REMOTE:
        # Local devices are set up before connecting starts the runtime.
        from trainer import modes

        modes.implementation(config.mode).configure_devices(config)
    strategy = distribute.create_strategy(mode.strategy)

    from trainer.training import Training

    try:
        with own_temp_dir():
            Training(config, info, strategy, progress, data_dir, startup).run()
    except (
        tf.errors.UnavailableError,
        tf.errors.DeadlineExceededError,
        tf.errors.CancelledError,
        tf.errors.AbortedError,
    ) as e:
        first = (e.message or type(e).__name__).strip().splitlines()[0]
        raise ClusterError(f"lost contact with another task of the job: {first}") from None


@contextlib.contextmanager
def own_temp_dir() -> Iterator[None]:
    """Every temporary file of the training (autograph's generated modules,
    a worker's checkpoint folder) in one folder, removed at the end. Python
    would remove autograph's files at exit, but a trainer process leaves by
    ``os._exit`` (``__main__.leave``), which skips that."""
    path = tempfile.mkdtemp(prefix="tfcluster-trainer-")
    tempfile.tempdir = path
    try:
        yield
    finally:
        tempfile.tempdir = None
        shutil.rmtree(path, ignore_errors=True)
