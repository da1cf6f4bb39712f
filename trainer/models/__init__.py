"""Model modules, one per concept: classifiers (cnn, convnet), the denoising
autoencoder (dae) and the stacked one (sdae). ``create_task`` is the registry."""

from __future__ import annotations

from trainer.flags import Config
from trainer.models.base import Task


def create_task(config: Config) -> Task:
    if config.model in ("cnn", "convnet"):
        from trainer.models.classifier import ClassifierTask

        return ClassifierTask(config.model)
    if config.model == "dae":
        from trainer.models.dae import DenoisingTask

        return DenoisingTask(config)
    if config.model == "sdae":
        from trainer.models.sdae import StackedDenoisingTask

        return StackedDenoisingTask(config)
    raise ValueError(f"unknown model {config.model!r}")
