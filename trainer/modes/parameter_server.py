"""``--mode async``: parameter server training.

The variables live on the ps tasks; the chief (this process: ps and
workers only serve, ``trainer/run.py``) schedules multi-step closures
onto the workers with a ClusterCoordinator and never waits for all of
them (``loop.run_async``). Each worker reads its own input stream.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from trainer import catalog
from trainer.data.inputs import worker_stream_key
from trainer.distribution.strategy import ClusterInfo
from trainer.flags import Config
from trainer.loop.loops import Monitor, PhaseRun, run_async
from trainer.loop.steps import overlapped_calls, train_calls
from trainer.models.base import Phase, Task
from trainer.models.hosting import host_dense_layers
from trainer.modes.base import NEVER_RELEASED, Call, DatasetFn, TrainingMode

if TYPE_CHECKING:
    from trainer.loop.checkpoints import State


class AsyncMode(TrainingMode):
    def __init__(
        self,
        entry: catalog.Mode,
        config: Config,
        info: ClusterInfo,
        strategy: tf.distribute.Strategy,
    ) -> None:
        super().__init__(entry, config, info, strategy)
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    def dataset_fn(self, task: Task, data_dir: Path, start: int) -> DatasetFn:
        folder, batch_size, seed = str(data_dir), self.config.batch_size, self.config.seed

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            # Which worker ran which step is not recorded: a resumed async
            # run draws fresh streams (salted by the step) instead.
            key = worker_stream_key(seed, salt=start)
            return task.build_inputs(folder, batch_size, 0, key)

        return dataset_fn

    def input_iterator(self, task: Task, data_dir: Path, start: int) -> Any:
        """Per worker: each worker's own pipeline, made on the worker."""
        dataset_fn = self.dataset_fn(task, data_dir, start)
        return iter(
            self.coordinator.create_per_worker_dataset(
                lambda: self.strategy.distribute_datasets_from_function(dataset_fn)
            )
        )

    @property
    def overlapped(self) -> bool:
        """--overlap with one replica per worker."""
        return bool(self.config.options["overlap"]) and self.strategy.num_replicas_in_sync == 1

    @functools.cached_property
    def dense_on_ps(self) -> bool:
        """--dense-on-ps, where the step is not XLA-compiled (a compiled
        step runs on one device). By default only where the workers compute
        on CPUs (this process sees no GPU: a cluster's nodes are alike), as
        a GPU worker does on its GPU what the ps would do on its CPU."""
        chosen = self.config.options["dense_on_ps"]
        if chosen is None:
            chosen = not tf.config.list_physical_devices("GPU")
        return bool(chosen) and not self.config.jit

    def calls(self, phase: Phase, optimizer: keras.optimizers.Optimizer, state: State) -> Call:
        """Overlapped with the ps's updates (``--overlap``), else step by
        step; each step claims its place first, so none goes past the
        phase's end; the model's dense layers on the ps (``--dense-on-ps``)."""
        variables, jit = state.model.variables, self.config.jit
        if self.dense_on_ps:
            host_dense_layers(state.model)
        claims = self.claims
        if self.overlapped:
            return overlapped_calls(
                self.strategy, phase, optimizer, variables, state.step, jit=jit, claims=claims
            )
        return train_calls(
            self.strategy, phase, optimizer, variables, state.step, jit=jit, claims=claims
        )

    @functools.cached_property
    def claims(self) -> tf.Variable:
        """The places the workers' steps take, on the ps (``claim_step``):
        not checkpointed, set to the global step before each round."""
        with self.strategy.scope():
            return tf.Variable(0, dtype=tf.int64, trainable=False, name="step_claims")

    def loop(
        self, runs: list[PhaseRun], iterator: Any, monitor: Monitor, step: tf.Variable, start: int
    ) -> int:
        return run_async(
            self.coordinator,
            runs,
            iterator,
            monitor,
            step,
            self.claims,
            per_call=self.config.steps_per_call,
            in_flight=2 * self.workers,
        )

    def summary(self) -> dict[str, Any]:
        return {
            "overlap": self.overlapped,
            "dense_on_ps": self.dense_on_ps,
            **super().summary(),
        }

    def leave(self, iterator: Any) -> None:
        # The process leaves by os._exit next: deleting the coordinator
        # (it joins its worker threads) and the per-worker iterators (a
        # call to every worker each) would only delay the job's end.
        NEVER_RELEASED.extend([self.coordinator, iterator])


MODE = AsyncMode
