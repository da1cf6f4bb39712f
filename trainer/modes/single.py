"""``--mode single``: one process, every local device.

The strategy is MirroredStrategy over the local GPUs when there are any,
else the default strategy; everything else is ``TrainingMode``'s default.
"""

from __future__ import annotations

from trainer.modes.base import TrainingMode


class SingleMode(TrainingMode):
    pass


MODE = SingleMode
