"""The step size a phase's optimizer takes (``--lr-schedule``).

``cosine`` (the default) decays it from ``--learning-rate`` to 0 along half
a cosine over the phase's steps, counted by the phase's optimizer (its
iterations: on the ps in async mode, one per step applied by any worker).
With it the MNIST CNN in async mode with 2 workers reached 99.38 % test
accuracy in 5 epochs of the full data set (bench/accuracy.py), where
issue 29 reports 99.19 % with a constant rate: small late steps average
out the noise of stale gradients instead of adding to it. ``constant``
keeps ``--learning-rate`` throughout.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import keras

from trainer.flags import Config
from trainer.models.base import Phase

# A fixed step size, or a Keras schedule of the optimizer's iterations.
LearningRate: TypeAlias = "float | keras.optimizers.schedules.LearningRateSchedule"


def learning_rate(config: Config, phase: Phase) -> LearningRate:
    """What ``phase``'s optimizer is built with."""
    if config.lr_schedule == "constant":
        return config.learning_rate
    if config.lr_schedule == "cosine":
        steps = max(1, phase.end - phase.start)
        return keras.optimizers.schedules.CosineDecay(config.learning_rate, decay_steps=steps)
    raise ValueError(f"unknown learning-rate schedule {config.lr_schedule!r}")


def current(optimizer: Any) -> float:
    """The step size ``optimizer`` takes now (at its iteration count)."""
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))
