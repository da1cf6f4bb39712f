"""The model boundary: what a model module gives the training loop.

A ``Task`` (one per model name) builds its Keras model, the training
``phases`` (one for plain models; greedy pretraining then fine-tuning for the
stacked DAE), its per-worker input pipeline and its evaluation. The loop in
``trainer/loop/loops.py`` knows nothing else about models.

Losses are pure functions of a batch evaluated inside a Keras
``StatelessScope`` that maps every model variable to a tensor value, so the
loop can run them on values read from wherever the variables live (a
parameter server, a mirrored replica, a local copy) and optionally XLA-compile
them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import keras
import numpy as np
import tensorflow as tf

from trainer.data.mnist import Split

Batch = dict[str, tf.Tensor]
# (per-example loss [B], batch metrics {name: scalar}) of one batch, training mode.
LossFn = Callable[[Batch], tuple[tf.Tensor, dict[str, tf.Tensor]]]


@dataclass
class Phase:
    """Steps ``[start, end)`` of the global step that train ``variables`` on ``loss``."""

    name: str
    start: int
    end: int
    variables: Sequence[keras.Variable]
    loss: LossFn
    metric_names: tuple[str, ...]


@dataclass
class Evaluation:
    """Held-out results for summary.json, and for autoencoders the sample
    images: ``{"G": originals, "C": corrupted, "R": reconstructed}`` (rows
    of samples.png), with a title for any row."""

    results: dict[str, float]
    samples: dict[str, np.ndarray] = field(default_factory=dict)
    titles: dict[str, str] = field(default_factory=dict)


class Task(Protocol):
    name: str

    def build_model(self) -> keras.Model:
        """Create the model and every variable it will ever use (call under
        the strategy's scope: no variable may appear later, for example when
        the second layer of the stacked DAE starts training)."""
        ...

    def phases(self, model: keras.Model, total_steps: int) -> list[Phase]: ...

    def train_examples(self, num_images: int) -> int:
        """Examples in one epoch of ``num_images`` training images."""
        ...

    def build_inputs(
        self, data_dir: str, batch_size: int, start_batch: int, key: tf.Tensor
    ) -> tf.data.Dataset:
        """Batches for one pipeline, read from ``data_dir`` by TF ops."""
        ...

    def evaluate(self, model: keras.Model, test: Split, seed: int) -> Evaluation: ...

    def describe(self) -> dict[str, Any]:
        """Model settings recorded in summary.json."""
        ...
