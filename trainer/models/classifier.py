"""MNIST classifiers: ``cnn`` (source D) and ``convnet`` (source C).

cnn: conv 5x5x32 SAME relu + maxpool 2 -> conv 5x5x64 SAME relu + maxpool 2
-> dense 1024 relu -> dropout 0.5 -> dense 10.
convnet: conv 5x5x64 + maxpool 2 -> conv 3x3x256 -> conv 3x3x512 + maxpool 2
-> dense 2048 + dropout -> dense 1024 + dropout -> dense 10 (keep 0.75).

Dropout is ``tf.nn.experimental.stateless_dropout`` seeded by the batch, not
``keras.layers.Dropout``: the Keras layer keeps its RNG state in a variable
with aggregation "none", which a replica of MultiWorkerMirroredStrategy may
not assign to, and which would cost a parameter-server round trip per step in
async mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.data import Split
from trainer.flags import Config
from trainer.inputs import index_batches, step_seed
from trainer.models.base import Batch, Evaluation, Phase

L = keras.layers


@dataclass(frozen=True)
class Architecture:
    convs: tuple[tuple[int, int, bool], ...]  # (filters, kernel, maxpool after)
    dense: tuple[int, ...]
    dropout: float


ARCHITECTURES = {
    "cnn": Architecture(convs=((32, 5, True), (64, 5, True)), dense=(1024,), dropout=0.5),
    "convnet": Architecture(
        convs=((64, 5, True), (256, 3, False), (512, 3, True)), dense=(2048, 1024), dropout=0.25
    ),
}


class Classifier(keras.Model):
    def __init__(self, arch: Architecture, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.arch = arch
        self.features: list[keras.Layer] = []
        for filters, kernel, pool in arch.convs:
            self.features.append(L.Conv2D(filters, kernel, padding="same", activation="relu"))
            if pool:
                self.features.append(L.MaxPooling2D(2))
        self.features.append(L.Flatten())
        self.hidden = [L.Dense(units, activation="relu") for units in arch.dense]
        self.logits = L.Dense(10)
        # A tf.train.Checkpoint holds a Keras 3 layer's attributes, but not
        # the layers inside its lists (Keras' TrackedList is no TensorFlow
        # trackable): without these, a checkpoint held the logits layer
        # alone, and --resume went on from freshly initialised convolutions.
        for i, layer in enumerate([*self.features, *self.hidden]):
            setattr(self, f"layer_{i}", layer)

    def call(
        self, x: tf.Tensor, training: bool = False, seed: tf.Tensor | None = None
    ) -> tf.Tensor:
        h = x
        for layer in self.features:
            h = layer(h)
        for i, dense in enumerate(self.hidden):
            h = dense(h)
            if training and seed is not None:
                h = tf.nn.experimental.stateless_dropout(
                    h, self.arch.dropout, seed=step_seed(seed, i)
                )
        return self.logits(h)


class ClassifierTask:
    def __init__(self, name: str) -> None:
        self.name = name
        self.arch = ARCHITECTURES[name]

    def build_model(self) -> keras.Model:
        model = Classifier(self.arch, name=self.name)
        model(tf.zeros([1, 28, 28, 1]))  # creates every variable now, under the caller's scope
        return model

    def phases(self, model: keras.Model, total_steps: int) -> list[Phase]:
        def loss(batch: Batch) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
            # float32 for the loss and softmax also under mixed precision
            # (where the layers compute in float16).
            logits = tf.cast(model(batch["x"], training=True, seed=batch["seed"]), tf.float32)
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(batch["y"], logits)
            correct = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), batch["y"])
            return per_example, {"accuracy": tf.reduce_mean(tf.cast(correct, tf.float32))}

        return [Phase("train", 0, total_steps, model.trainable_variables, loss, ("accuracy",))]

    def train_examples(self, num_images: int) -> int:
        return num_images

    def build_inputs(
        self,
        data_dir: str,
        batch_size: int,
        start_batch: int,
        key: tf.Tensor,
        shard: tuple[int, int] | None = None,
    ) -> tf.data.Dataset:
        """``shard`` (index, count): only every count-th image from index
        on (an ensemble member's own part of the data)."""
        from trainer.data import read_split_tf

        images, labels = read_split_tf(data_dir, "train")
        if shard is not None:
            index, count = shard
            images, labels = images[index::count], labels[index::count]

        def cut(item: dict[str, tf.Tensor]) -> Batch:
            x = tf.cast(tf.gather(images, item["index"]), tf.float32) / 255.0
            return {"x": x[..., None], "y": tf.gather(labels, item["index"]), "seed": item["seed"]}

        stream = index_batches(tf.shape(labels)[0], batch_size, start_batch, key)
        return stream.map(cut, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    def evaluate(self, model: keras.Model, test: Split, seed: int) -> Evaluation:
        predict = tf.function(lambda x: tf.cast(model(x, training=False), tf.float32))
        correct, total_loss = 0, 0.0
        for begin in range(0, len(test), 500):
            x = test.images[begin : begin + 500, :, :, None].astype(np.float32) / 255.0
            y = test.labels[begin : begin + 500].astype(np.int32)
            logits = predict(tf.constant(x)).numpy()
            correct += int((logits.argmax(axis=-1) == y).sum())
            total_loss += float(
                tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
            )
        return Evaluation(
            results={"test_accuracy": correct / len(test), "test_loss": total_loss / len(test)}
        )

    def describe(self) -> dict[str, Any]:
        return {"dropout": self.arch.dropout}


def create_task(config: Config) -> ClassifierTask:
    return ClassifierTask(config.model)
