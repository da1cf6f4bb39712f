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
from trainer.distribution.accelerators import bfloat16_native
from trainer.distribution.strategy import ClusterInfo
from trainer.flags import Config
from trainer.loop.loops import Monitor, PhaseRun, run_async
from trainer.loop.steps import overlapped_calls, train_calls
from trainer.models.base import Phase, Task
from trainer.models.hosting import host_dense_layers
from trainer.modes.base import NEVER_RELEASED, Call, DatasetFn, TrainingMode

if TYPE_CHECKING:
    from trainer.loop.checkpoints import State


# Keras' policy for --bfloat16: bfloat16 computation, float32 variables.
BFLOAT16_POLICY = "mixed_bfloat16"


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
    def precision(self) -> tuple[bool, str]:
        """Whether the model computes in bfloat16, and why: ``--bfloat16``
        or ``--no-bfloat16`` as given; by default where this machine
        computes bfloat16 natively (a CPU with AVX512-BF16 or AMX, GPUs
        with bfloat16 tensor cores), since elsewhere it only adds casts.
        Only the models whose losses read float32 logits out of a
        lower-precision model (those that take --mixed-precision elsewhere)."""
        if not catalog.model(self.config.model).mixed_precision:
            return False, f"{self.config.model} computes in float32"
        chosen = self.config.options["bfloat16"]
        if chosen is not None:
            return bool(chosen), "--bfloat16" if chosen else "--no-bfloat16"
        native, why = bfloat16_native()
        return native, f"default: {why}"

    @property
    def bfloat16(self) -> bool:
        return self.precision[0]

    def build_model(self, task: Task) -> keras.Model:
        """The model, its layers computing in bfloat16 with ``bfloat16``.
        Keras' policy is global and read when a layer is made: set for
        this model's layers only. No loss scale: bfloat16 has float32's
        exponent range, so gradients do not underflow where float16's do
        (and async mode has no place for a scale: it would live on the ps)."""
        if not self.bfloat16:
            return super().build_model(task)
        before = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(BFLOAT16_POLICY)
        try:
            return super().build_model(task)
        finally:
            keras.mixed_precision.set_global_policy(before)

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
        step, each step guarded against overshooting the phase's end; the
        model's dense layers on the ps (``--dense-on-ps``)."""
        variables, jit = state.model.variables, self.config.jit
        if self.dense_on_ps:
            host_dense_layers(state.model)
        if self.overlapped:
            return overlapped_calls(self.strategy, phase, optimizer, variables, state.step, jit=jit)
        return train_calls(
            self.strategy, phase, optimizer, variables, state.step, jit=jit, guard=True
        )

    def loop(
        self, runs: list[PhaseRun], iterator: Any, monitor: Monitor, step: tf.Variable, start: int
    ) -> int:
        return run_async(
            self.coordinator,
            runs,
            iterator,
            monitor,
            step,
            per_call=self.config.steps_per_call,
            in_flight=2 * self.workers,
        )

    def summary(self) -> dict[str, Any]:
        return {
            "overlap": self.overlapped,
            "dense_on_ps": self.dense_on_ps,
            "bfloat16": self.bfloat16,
            "bfloat16_why": self.precision[1],
        }

    def leave(self, iterator: Any) -> None:
        # The process leaves by os._exit next: deleting the coordinator
        # (it joins its worker threads) and the per-worker iterators (a
        # call to every worker each) would only delay the job's end.
        NEVER_RELEASED.extend([self.coordinator, iterator])


MODE = AsyncMode
