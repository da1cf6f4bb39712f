"""The training modes on the TensorFlow side, one module each.

``trainer/catalog.py`` is the one list of modes: each entry names its
module here, whose ``MODE`` is its ``TrainingMode`` subclass
(``trainer/modes/base.py``). A new mode is a module here and its entry in
the catalog. ``--mode layers`` (``layers.py``) has two pieces of its own
beside it: ``placement.py`` builds the model with each layer on its
stage's device, and ``pipeline.py`` is its pipelined training step.

Imports everything of the trainer below it (loop, distribution, models,
data, the catalog)."""

from __future__ import annotations

import importlib

import tensorflow as tf

from trainer import catalog
from trainer.distribution.strategy import ClusterInfo
from trainer.flags import Config
from trainer.modes.base import TrainingMode


def implementation(name: str) -> type[TrainingMode]:
    """The ``TrainingMode`` class of the catalog's mode ``name``."""
    module = importlib.import_module(catalog.mode(name).module)
    cls = module.MODE
    if not (isinstance(cls, type) and issubclass(cls, TrainingMode)):
        raise TypeError(f"{module.__name__}.MODE is not a TrainingMode subclass")
    return cls


def create(config: Config, info: ClusterInfo, strategy: tf.distribute.Strategy) -> TrainingMode:
    """This process's part in a run of ``config.mode``."""
    return implementation(config.mode)(catalog.mode(config.mode), config, info, strategy)
