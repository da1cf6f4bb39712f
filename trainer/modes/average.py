"""``--mode average``: parameter averaging (source E).

Each process steps a private replica of the model on its own input
pipeline; every ``--average-every`` steps, at the end of each phase and
before each checkpoint the replicas are replaced by their mean (one
all-reduce of MultiWorkerMirroredStrategy). They start equal: the chief's
initial (or restored) values are broadcast first.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from trainer.data.mnist import Split
from trainer.distribution import collectives
from trainer.distribution import strategy as distribute
from trainer.models.base import Task
from trainer.modes.base import CollectiveMode

if TYPE_CHECKING:
    from trainer.loop.checkpoints import State


class AverageMode(CollectiveMode):
    private = True
    start_equal = True
    fingerprint = True

    def prepare(self, state: State) -> None:
        super().prepare(state)
        # A checkpoint holds averaged parameters.
        self.before_save = collectives.averager(self.strategy, state.model.variables)

    def input_iterator(self, task: Task, data_dir: Path, start: int) -> Any:
        """The private replica's batches: this worker's pipeline of all."""
        context = tf.distribute.InputContext(
            num_input_pipelines=self.workers,
            input_pipeline_id=distribute.worker_index(self.info),
            num_replicas_in_sync=1,
        )
        return iter(self.dataset_fn(task, data_dir, start)(context))

    def extra_marks(self) -> list[int]:
        return [self.config.options["average_every"]]

    def after_call(self) -> Callable[[int, bool], None] | None:
        """Average every ``--average-every`` steps and at each phase's end."""
        average, every = self.before_save, self.config.options["average_every"]
        assert average is not None, "prepare() makes the averager"

        def after_call(step: int, phase_end: bool) -> None:
            if step % every == 0 or phase_end:
                average()

        return after_call

    def evaluate_now(self, task: Task, model: keras.Model, test: Split) -> dict[str, Any] | None:
        """The averaged model's accuracy (every process averages, then the
        chief evaluates): between averages each replica is only its own."""
        assert self.before_save is not None, "prepare() makes the averager"
        self.before_save()
        return super().evaluate_now(task, model, test)

    def summary(self) -> dict[str, Any]:
        return {"average_every": self.config.options["average_every"]}


MODE = AverageMode
