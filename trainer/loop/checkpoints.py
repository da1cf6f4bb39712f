"""Periodic checkpoints and ``--resume``.

The chief keeps the last few checkpoints in ``<output>/checkpoints``
(``tf.train.CheckpointManager``, named by global step). Under
MultiWorkerMirroredStrategy every worker must take part in a save, so the
other workers of sync and average mode write theirs to a private temporary
folder and delete it at once. A checkpoint holds the model, every phase's
optimizer (slots and iteration counts) and the global step; the input
position follows from the step (see ``trainer/data/inputs.py``).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from trainer.errors import CheckpointError
from trainer.models.base import Phase

MAX_TO_KEEP = 3


@dataclass
class State:
    """Everything a checkpoint holds, created up front (by ``Training``;
    the modes read it, so it lives here, below both)."""

    model: keras.Model
    phases: list[Phase]
    optimizers: list[keras.optimizers.Optimizer]
    step: tf.Variable  # the global step

    def variables(self) -> list[Any]:
        return [
            *self.model.variables,
            *(v for o in self.optimizers for v in o.variables),
            self.step,
        ]

    def checkpoint(self) -> tf.train.Checkpoint:
        optimizers = {f"optimizer_{i}": o for i, o in enumerate(self.optimizers)}
        return tf.train.Checkpoint(model=self.model, step=self.step, **optimizers)


class Checkpoints:
    def __init__(
        self,
        checkpoint: tf.train.Checkpoint,
        output_dir: Path,
        *,
        is_chief: bool,
        keep: int = MAX_TO_KEEP,
        options: tf.train.CheckpointOptions | None = None,
    ):
        self.checkpoint = checkpoint
        self.is_chief = is_chief
        # --mode layers: the chief reads and writes every variable's file
        # (its variables live on other tasks, whose disks are elsewhere).
        self.options = options
        self.directory = output_dir / "checkpoints"
        self.manager = (
            tf.train.CheckpointManager(
                checkpoint, str(self.directory), max_to_keep=keep or None, checkpoint_name="ckpt"
            )
            if is_chief
            else None
        )
        self.last_saved_step: int | None = None

    def restore_latest(self) -> str:
        """Restore the newest checkpoint of the output folder (chief only)."""
        assert self.manager is not None, "only the chief restores"
        path = self.manager.latest_checkpoint
        if path is None:
            raise CheckpointError(f"--resume: no checkpoint in {self.directory}")
        try:
            self.checkpoint.restore(path, options=self.options).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(f"{path} does not fit this model: {first}") from None
        return path

    def save(self, step: int) -> str | None:
        """Save at ``step``; the chief's checkpoint path (None elsewhere)."""
        self.last_saved_step = step
        if self.manager is not None:
            return str(self.manager.save(checkpoint_number=step, options=self.options))
        scratch = tempfile.mkdtemp(prefix="tfcluster-worker-ckpt-")
        try:
            self.checkpoint.write(str(Path(scratch) / "ckpt"), options=self.options)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None
