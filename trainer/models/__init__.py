"""Model modules, one per concept: classifiers (cnn, convnet), the denoising
autoencoder (dae) and the stacked one (sdae).

``trainer/catalog.py`` names each model's module; the module's
``create_task(config)`` makes its ``Task`` (``trainer/models/base.py``).
A new model is a module here and its line in the catalog. ``hosting.py``
is a layer the classifiers share: a dense layer computed where its weights
live (async mode's ``--dense-on-ps``)."""

from __future__ import annotations

import importlib

from trainer import catalog
from trainer.flags import Config
from trainer.models.base import Task


def create_task(config: Config) -> Task:
    module = importlib.import_module(catalog.model(config.model).module)
    task: Task = module.create_task(config)
    return task
