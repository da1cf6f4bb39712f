"""``--mode ensemble``: many cheap models, then their average.

Every training process of the job (the chief and each worker) trains a
model of its own (``--ensemble-models cnn,convnet``: member i trains the
i-th, round robin; default ``--model`` for all), from its own seed, on its
own shard of the training images (every N-th image from its position on:
the members see disjoint data, as the source material's "different models
on data shards" does). Nothing is shared while training: the collective
runtime of MultiWorkerMirroredStrategy is used once, at the end, to gather
every member's predicted class probabilities on the test set to every
process; the chief then scores each member and the ensemble (the members'
averaged probabilities) and writes both into summary.json.

``EnsembleMode`` is the mode; the functions before it pick each member's
model and seed, and gather and score the members' predictions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer import catalog
from trainer.data.inputs import stream_key
from trainer.data.mnist import Split, load_split
from trainer.distribution import strategy as distribute
from trainer.distribution.strategy import ClusterInfo
from trainer.flags import Config
from trainer.models.base import Task
from trainer.modes.base import CollectiveMode

# Test images per prediction call.
BATCH = 500


def member_model(config: Config, member: int) -> str:
    models = config.ensemble_models or (config.model,)
    return models[member % len(models)]


def member_config(config: Config, member: int) -> Config:
    """The configuration member ``member`` trains with: its model, and a
    seed of its own (the same seed would start equal models equal)."""
    return replace(config, model=member_model(config, member), seed=config.seed + member)


def member_names(info: ClusterInfo) -> list[str]:
    """Task names in member order (``distribute.worker_index``'s order)."""
    names = [f"chief-{i}" for i in range(info.count("chief"))]
    names += [f"worker-{i}" for i in range(info.count("worker"))]
    return names or [info.name]


def probabilities(model: keras.Model, test: Split) -> np.ndarray:
    """The model's class probabilities for every test image, [N, 10]."""
    predict = tf.function(lambda x: tf.nn.softmax(model(x, training=False)))
    out = []
    for begin in range(0, len(test), BATCH):
        x = test.images[begin : begin + BATCH, :, :, None].astype(np.float32) / 255.0
        out.append(predict(tf.constant(x)).numpy())
    return np.concatenate(out).astype(np.float32)


def gather(
    strategy: tf.distribute.Strategy, info: ClusterInfo, members: int, mine: np.ndarray
) -> np.ndarray:
    """Every member's probabilities, [members, N, 10], on every process: a
    SUM all-reduce in which each member fills only its own slot."""
    index = distribute.worker_index(info)
    slots = np.zeros((members, *mine.shape), np.float32)
    slots[index] = mine
    if members == 1:
        return slots
    value = tf.constant(slots)

    @tf.function
    def run() -> Any:
        return strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, value
            )
        )

    return np.asarray(strategy.experimental_local_results(run())[0].numpy())


def _accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    return float((probs.argmax(axis=-1) == labels).mean())


def _loss(probs: np.ndarray, labels: np.ndarray) -> float:
    picked = probs[np.arange(len(labels)), labels]
    return float(-np.log(np.clip(picked, 1e-7, 1.0)).mean())


def score(
    all_probs: np.ndarray, labels: np.ndarray, names: Sequence[str], models: Sequence[str]
) -> dict[str, Any]:
    """summary.json's results: the ensemble's test accuracy and loss (as
    any run's), and under ``ensemble`` each member's and the gain of the
    ensemble over its best member."""
    labels = labels.astype(np.int64)
    members: list[dict[str, Any]] = [
        {
            "task": name,
            "model": model,
            "test_accuracy": _accuracy(probs, labels),
            "test_loss": _loss(probs, labels),
        }
        for name, model, probs in zip(names, models, all_probs, strict=True)
    ]
    mean = all_probs.mean(axis=0)
    accuracy = _accuracy(mean, labels)
    best = max(float(m["test_accuracy"]) for m in members)
    return {
        "test_accuracy": accuracy,
        "test_loss": _loss(mean, labels),
        "ensemble": {
            "members": members,
            "test_accuracy": accuracy,
            "test_loss": _loss(mean, labels),
            "best_member_accuracy": best,
            "gain": accuracy - best,
        },
    }


def evaluate(
    strategy: tf.distribute.Strategy,
    info: ClusterInfo,
    config: Config,
    model: keras.Model,
    test: Split,
) -> dict[str, Any]:
    """Every process: its member's predictions into the gather; the scores
    (on every process; the chief writes them)."""
    names = member_names(info)
    mine = probabilities(model, test)
    all_probs = gather(strategy, info, len(names), mine)
    models = [member_model(config, i) for i in range(len(names))]
    return score(all_probs, test.labels, names, models)


class EnsembleMode(CollectiveMode):
    private = True

    def __init__(
        self,
        entry: catalog.Mode,
        config: Config,
        info: ClusterInfo,
        strategy: tf.distribute.Strategy,
    ) -> None:
        # This process's member: its own model and seed.
        member = member_config(config, distribute.worker_index(info))
        super().__init__(entry, member, info, strategy)

    def input_iterator(self, task: Task, data_dir: Path, start: int) -> Any:
        """The member's own shard: every N-th image from its position on."""
        from trainer.models.classifier import ClassifierTask

        assert isinstance(task, ClassifierTask), "an ensemble averages classifiers"
        member = distribute.worker_index(self.info)
        return iter(
            task.build_inputs(
                str(data_dir),
                self.config.batch_size,
                start,
                stream_key(self.config.seed, member),
                shard=(member, self.workers),
            )
        )

    def evaluate_now(self, task: Task, model: keras.Model, test: Split) -> dict[str, Any] | None:
        """The ensemble's accuracy: every member's predictions gathered (a
        collective of every process), as at the end."""
        results = evaluate(self.strategy, self.info, self.config, model, test)
        return results if self.info.is_chief else None

    def after_training(self, model: keras.Model, final_step: int, data_dir: Path) -> Any:
        """Every member takes part in the gather; the chief writes the scores."""
        test = load_split(data_dir, "test")
        return evaluate(self.strategy, self.info, self.config, model, test)


MODE = EnsembleMode
