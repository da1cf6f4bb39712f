"""What the peer programs share: their flags, the MNIST arrays, the CNN
(the trainer's ``cnn``: two 5x5 convolutions of 32 and 64 filters with 2x2
pooling, a 1024-unit dense layer, dropout 0.5, 10 logits), a ps or worker
task's server, the timing callback and the result line.

The CNN is written once here for any Keras (Keras 3, or Keras 2 as
``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``), as the Keras guides write a
model: a ``Sequential`` of layers."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

# The chief's line that bench/peers.py reads: the prefix, then one JSON object.
RESULT = "@peer "


def parse(description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=150, help="steps in all, warm-up included")
    p.add_argument("--warmup", type=int, default=25, help="steps left out of the timing")
    p.add_argument("--batch-size", type=int, default=128, help="examples per replica per step")
    p.add_argument("--steps-per-execution", type=int, default=1)
    p.add_argument("--data-dir", default=os.environ.get("MNIST_DIR"))
    return p.parse_args()


def mnist(data_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """The training images (uint8 [N, 28, 28]) and labels (int32 [N])."""
    from trainer.data.mnist import load_split, resolve_data_dir

    train = load_split(resolve_data_dir(data_dir), "train")
    return train.images, train.labels.astype(np.int32)


def to_inputs(image: Any, label: Any) -> tuple[Any, Any]:
    """A dataset map: pixels in [0, 1] with a channel axis (a graph of
    uint8 images is 4 times smaller than of floats)."""
    import tensorflow as tf

    return tf.cast(image, tf.float32)[..., None] / 255.0, label


def ps_dataset_fn(images: Any, labels: Any, batch_size: int) -> Any:
    """The parameter-server guide's ``dataset_fn``: each input pipeline's
    shard of the examples, shuffled, repeated, batched per replica."""
    import tensorflow as tf

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        per_replica = input_context.get_per_replica_batch_size(batch_size)
        data = tf.data.Dataset.from_tensor_slices((images, labels))
        data = data.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        data = data.shuffle(len(labels)).repeat().map(to_inputs)
        return data.batch(per_replica).prefetch(2)

    return dataset_fn


def cnn(keras: Any) -> Any:
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            layers.Conv2D(32, 5, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 5, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(1024, activation="relu"),
            layers.Dropout(0.5),
            layers.Dense(10),
        ]
    )


def serve_if_server(resolver: Any) -> None:
    """A ps or worker task of a parameter-server job: serve until killed
    (never returns), as the parameter-server guide's servers do."""
    import tensorflow as tf

    if resolver.task_type not in ("ps", "worker"):
        return
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    server.join()


def timer(keras: Any) -> Any:
    """A Keras callback that times ``fit`` from its first to its last step."""

    class Timer(keras.callbacks.Callback):
        seconds = 0.0

        def on_train_begin(self, logs: Any = None) -> None:
            self.began = time.perf_counter()

        def on_train_end(self, logs: Any = None) -> None:
            self.seconds = time.perf_counter() - self.began

    return Timer()


def keras_version(keras: Any) -> str:
    """``keras 3.x`` or ``tf_keras 2.x``: which Keras a program ran."""
    from importlib.metadata import version

    if keras.__name__.startswith("tf_keras"):
        return "tf_keras " + version("tf_keras")
    return "keras " + version("keras")


def report(steps: int, examples_per_step: int, seconds: float, **extra: Any) -> None:
    """The chief's result line: steady examples/s over ``steps`` timed steps."""
    result = {
        "examples_per_sec": steps * examples_per_step / seconds,
        "timed_steps": steps,
        "seconds": seconds,
        **extra,
    }
    print(RESULT + json.dumps(result), flush=True)
