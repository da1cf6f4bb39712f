"""``TrainingMode``: what one training mode does where the modes differ.

``trainer/training.py`` runs the same skeleton for every mode (build the
state, restore, stream the inputs, run the loop, checkpoint, evaluate,
write the run folder) and asks the mode at each point where they differ:
which scope the model is built in, which batches this process reads, how a
phase's steps are called, which loop runs them, what happens after the
last step, what summary.json adds, how the process leaves.

The defaults are those of the plain modes (single, and sync with
``CollectiveMode``): one model under the strategy's scope, batches
distributed by the strategy, every process running the same calls with
``run_synchronous``. A mode module (``trainer/modes/*.py``, named by its
entry in ``trainer/catalog.py``) defines ``MODE``, its subclass, and
overrides what it does otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from trainer import catalog
from trainer.data.inputs import stream_key
from trainer.data.mnist import Split
from trainer.distribution import collectives
from trainer.distribution import strategy as distribute
from trainer.distribution.accelerators import bfloat16_native
from trainer.distribution.strategy import ClusterInfo
from trainer.flags import Config
from trainer.loop.loops import Monitor, PhaseRun, run_synchronous
from trainer.loop.optimizers import FusedAdam
from trainer.loop.schedules import LearningRate
from trainer.loop.steps import CallResult, train_calls
from trainer.models.base import Phase, Task

if TYPE_CHECKING:
    from trainer.loop.checkpoints import State

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]
Call = Callable[[object, tf.Tensor, tf.Tensor], CallResult]

# TensorFlow objects a finished distributed run keeps until the process exits.
NEVER_RELEASED: list[Any] = []

# Keras' policy for --bfloat16: bfloat16 computation, float32 variables.
BFLOAT16_POLICY = "mixed_bfloat16"


def weights_fingerprint(variables: list[Any]) -> str:
    """A short hash of parameter values: equal on every worker of a sync or
    average job after training (the logs show it, the tests compare it)."""
    digest = hashlib.sha256()
    for v in variables:
        digest.update(v.numpy().tobytes())
    return digest.hexdigest()[:16]


class TrainingMode:
    """One process's part in one run of its mode. Made once per run, after
    the strategy (``distribute.create_strategy`` of the catalog's kind)."""

    # Each process steps a model of its own, built outside the strategy's
    # scope (average: kept in step by averaging; ensemble: never).
    private = False
    # Print the weights' fingerprint after the last step (the workers of a
    # job that keeps them equal; the tests compare the lines).
    fingerprint = False

    def __init__(
        self,
        entry: catalog.Mode,
        config: Config,
        info: ClusterInfo,
        strategy: tf.distribute.Strategy,
    ) -> None:
        self.entry = entry
        self.name = entry.name
        self.config = config
        self.info = info
        self.strategy = strategy
        self.workers = distribute.num_workers(info, entry.name)
        self.ps = info.num_ps if entry.needs_ps else 0
        # Set by a mode that averages before each checkpoint save.
        self.before_save: Callable[[], None] | None = None

    @property
    def examples_per_step(self) -> int:
        if self.private:
            # Each worker steps its private replica: one batch per worker.
            return self.config.batch_size * self.workers
        return self.config.batch_size * self.strategy.num_replicas_in_sync

    @property
    def train_strategy(self) -> tf.distribute.Strategy:
        """The strategy the steps run under: a private model's is the default."""
        return tf.distribute.get_strategy() if self.private else self.strategy

    def scope(self) -> contextlib.AbstractContextManager[Any]:
        """Where the state is built: private models outside any strategy."""
        return contextlib.nullcontext() if self.private else self.strategy.scope()

    @classmethod
    def configure_devices(cls, config: Config) -> None:
        """Before the strategy starts TensorFlow's runtime (modes of the
        ``REMOTE`` kind only: the others' strategies must come first)."""

    @functools.cached_property
    def precision(self) -> tuple[bool, str]:
        """Whether the model computes in bfloat16, and why. Only in the modes
        that take ``--bfloat16`` (catalog.BFLOAT16), for the models whose
        losses read float32 logits out of a lower-precision model (those
        that take --mixed-precision), never beside --mixed-precision's
        float16. ``--bfloat16``/``--no-bfloat16`` as given; by default where
        this machine computes bfloat16 natively (a CPU with AVX512-BF16 or
        AMX, GPUs with bfloat16 tensor cores): elsewhere it only adds casts."""
        if catalog.BFLOAT16 not in self.entry.options:
            return False, f"--mode {self.name} computes in float32"
        if not catalog.model(self.config.model).mixed_precision:
            return False, f"{self.config.model} computes in float32"
        if self.config.mixed_precision:
            return False, "--mixed-precision: float16"
        chosen = self.config.options[catalog.BFLOAT16.key]
        if chosen is not None:
            return bool(chosen), "--bfloat16" if chosen else "--no-bfloat16"
        native, why = bfloat16_native()
        return native, f"default: {why}"

    @property
    def bfloat16(self) -> bool:
        return self.precision[0]

    def build_model(self, task: Task) -> keras.Model:
        """The model, every variable created (in ``scope``); its layers
        computing in bfloat16 with ``bfloat16``. Keras' policy is global and
        read when a layer is made: set for this model's layers only. No loss
        scale: bfloat16 has float32's exponent range, so gradients do not
        underflow where float16's do (and async mode has no place for a
        scale: it would live on the ps)."""
        if not self.bfloat16:
            return task.build_model()
        before = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(BFLOAT16_POLICY)
        try:
            return task.build_model()
        finally:
            keras.mixed_precision.set_global_policy(before)

    def optimizer(self, learning_rate: LearningRate) -> keras.optimizers.Optimizer:
        """A phase's optimizer (before the mixed-precision wrapper): Adam,
        fused (``trainer/loop/optimizers.py`` says what it saves)."""
        return FusedAdam(learning_rate)

    def checkpoint_options(self) -> tf.train.CheckpointOptions | None:
        """How checkpoints are written and read (None: TensorFlow's default,
        each variable's file by the host it lives on)."""
        return None

    def prepare(self, state: State) -> None:
        """After the chief restored its checkpoint, before the first step."""

    def dataset_fn(self, task: Task, data_dir: Path, start: int) -> DatasetFn:
        """One input pipeline's batches, continuing a resumed run's stream."""
        folder, batch_size, seed = str(data_dir), self.config.batch_size, self.config.seed

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            per_pipeline = max(1, context.num_replicas_in_sync // context.num_input_pipelines)
            key = stream_key(seed, context.input_pipeline_id)
            return task.build_inputs(folder, batch_size, start * per_pipeline, key)

        return dataset_fn

    def input_iterator(self, task: Task, data_dir: Path, start: int) -> Any:
        """This run's batches: per replica, through the strategy."""
        dataset_fn = self.dataset_fn(task, data_dir, start)
        return iter(self.strategy.distribute_datasets_from_function(dataset_fn))

    def calls(self, phase: Phase, optimizer: keras.optimizers.Optimizer, state: State) -> Call:
        """The phase's multi-step call."""
        return train_calls(
            self.train_strategy,
            phase,
            optimizer,
            state.model.variables,
            state.step,
            jit=self.config.jit,
            claims=None,
        )

    def loop(
        self, runs: list[PhaseRun], iterator: Any, monitor: Monitor, step: tf.Variable, start: int
    ) -> int:
        """Run every phase to its end; the final global step."""
        config = self.config
        return run_synchronous(
            runs,
            iterator,
            monitor,
            start=start,
            per_call=config.steps_per_call,
            every=[
                config.log_every,
                config.checkpoint_every,
                monitor.eval_every,
                *self.extra_marks(),
            ],
            after_call=self.after_call(),
        )

    def extra_marks(self) -> list[int]:
        """Intervals besides logs and checkpoints that calls must end on."""
        return []

    def after_call(self) -> Callable[[int, bool], None] | None:
        """``fn(step, phase_end)`` after each call of the synchronous loop."""
        return None

    def evaluate_now(self, task: Task, model: keras.Model, test: Split) -> dict[str, Any] | None:
        """A test-set evaluation during training (``--eval-every``), called
        on every training process at the same step: the chief's results
        (None on the others)."""
        if not self.info.is_chief:
            return None
        return task.evaluate(model, test, self.config.seed).results

    def after_training(self, model: keras.Model, final_step: int, data_dir: Path) -> Any:
        """After the last step and its checkpoint, on every process: the
        held-out results that replace the chief's evaluation, or None."""
        if self.fingerprint:
            print(
                f"trainer: {self.info.name} weights fingerprint "
                f"{weights_fingerprint(model.variables)} at step {final_step}",
                flush=True,
            )
        return None

    def summary(self) -> dict[str, Any]:
        """The mode's own entries of summary.json: what it computes in, and why."""
        return {"bfloat16": self.bfloat16, "bfloat16_why": self.precision[1]}

    def leave(self, iterator: Any) -> None:
        """The run is written; the process exits next (``__main__.leave``)."""


class CollectiveMode(TrainingMode):
    """Every training process runs the program and meets the others in
    MultiWorkerMirroredStrategy's collectives (sync, average, ensemble)."""

    # Broadcast the chief's state at the start of every run, not only after
    # --resume (only the chief read the checkpoint: nodes need not share a disk).
    start_equal = False

    @property
    def collective(self) -> bool:
        return self.workers > 1

    def prepare(self, state: State) -> None:
        if self.collective and (self.config.resume or self.start_equal):
            collectives.broadcaster(self.strategy, state.variables())()

    def leave(self, iterator: Any) -> None:
        if not self.collective:
            return
        # Workers wait for the chief's evaluation, so that nobody sees a
        # peer vanish while it still works.
        collectives.barrier(self.strategy)
        # Deleting a MultiWorkerMirroredStrategy input iterator can block
        # for 30 s and more (TF 2.21, seen on a busy machine); a
        # collective task leaves by os._exit (``__main__.leave``) before
        # anything kept here would be deleted.
        NEVER_RELEASED.append(iterator)
        collectives.leave_together(self.info)
