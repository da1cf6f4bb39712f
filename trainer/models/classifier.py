"""MNIST classifiers: ``cnn`` (source D) and ``convnet`` (source C).

cnn: conv 5x5x32 SAME relu + maxpool 2 -> conv 5x5x64 SAME relu + maxpool 2
-> dense 1024 relu -> dropout 0.5 -> dense 10.
convnet: conv 5x5x64 + maxpool 2 -> conv 3x3x256 -> conv 3x3x512 + maxpool 2
-> dense 2048 + dropout -> dense 1024 + dropout -> dense 10 (keep 0.75).
The hidden dense layers are ``HostedDense``: computed on the ps in async
mode (``trainer/models/hosting.py``).

Dropout (``StatelessDropout``) is ``tf.nn.experimental.stateless_dropout``
seeded by the batch, not ``keras.layers.Dropout``: the Keras layer keeps its RNG state in a variable
with aggregation "none", which a replica of MultiWorkerMirroredStrategy may
not assign to, and which would cost a parameter-server round trip per step in
async mode.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.data.inputs import index_batches, step_seed
from trainer.data.mnist import Split
from trainer.flags import Config
from trainer.layers.architectures import ARCHITECTURES, SIDE, Architecture, classifier_layers
from trainer.models.base import Batch, Evaluation, Phase
from trainer.models.hosting import HostedDense

L = keras.layers


class StatelessDropout(keras.layers.Layer):
    """Dropout of ``rate`` while training, its mask drawn from the batch's
    seed (``salt``: this layer's own draw); the identity otherwise. A layer
    of its own, so that ``--mode layers`` places it with the layers around
    it, and its name (dropout, dropout_1) is the model's."""

    def __init__(self, rate: float, salt: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rate = rate
        self.salt = salt

    def call(
        self, h: tf.Tensor, seed: tf.Tensor | None = None, training: bool = False
    ) -> tf.Tensor:
        if training and seed is not None:
            return tf.nn.experimental.stateless_dropout(
                h, self.rate, seed=step_seed(seed, self.salt)
            )
        return h

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape


class Classifier(keras.Model):
    def __init__(self, arch: Architecture, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.arch = arch
        # Named as trainer/layers/architectures.py lists them, in call order.
        names = iter(layer.name for layer in classifier_layers(arch))
        self.features: list[keras.Layer] = []
        for filters, kernel, pool in arch.convs:
            self.features.append(
                L.Conv2D(filters, kernel, padding="same", activation="relu", name=next(names))
            )
            if pool:
                self.features.append(L.MaxPooling2D(2, name=next(names)))
        self.features.append(L.Flatten(name=next(names)))
        self.hidden: list[keras.Layer] = []
        self.dropouts: list[keras.Layer] = []
        for i, units in enumerate(arch.dense):
            self.hidden.append(HostedDense(units, activation="relu", name=next(names)))
            self.dropouts.append(StatelessDropout(arch.dropout, salt=i, name=next(names)))
        self.logits = L.Dense(10, name=next(names))
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
        for dense, dropout in zip(self.hidden, self.dropouts, strict=True):
            h = dropout(dense(h), seed=seed, training=training)
        return self.logits(h)


class ClassifierTask:
    def __init__(self, name: str) -> None:
        self.name = name
        self.arch = ARCHITECTURES[name]

    def new_model(self) -> keras.Model:
        return Classifier(self.arch, name=self.name)

    def example_input(self) -> tf.Tensor:
        return tf.zeros([1, SIDE, SIDE, 1])

    def build_model(self) -> keras.Model:
        model = self.new_model()
        model(self.example_input())  # creates every variable now, under the caller's scope
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
        from trainer.data.mnist import read_split_tf

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
