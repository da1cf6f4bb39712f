"""Keras `model.fit` under MultiWorkerMirroredStrategy, as TensorFlow's
multi-worker tutorial writes it (tf.keras, the strategy, compile, fit).

Every task (the chief and each worker) runs this file with its own TF_CONFIG
and trains the same model; the strategy all-reduces the gradients every
step. There is no ps: start it with `deploy.py run --no-ps`. The chief
writes result.json into $TFCLUSTER_RUN_DIR, the folder that comes home.

It uses `tf.keras` and never imports `keras` itself, so tfcluster runs it
with TF_USE_LEGACY_KERAS=1: `tf.keras` is then Keras 2 (the tf-keras package,
installed on every node at TensorFlow's version), whose `fit` supports this
strategy (Keras 3's `fit` fails under it: keras-team/keras#20585).
The images are synthetic (a class is a bright band at its own rows), so
nothing is downloaded and the accuracy ends near 1.

    deploy.py run --no-ps -- python keras_fit_collective.py --epochs 3
"""

from __future__ import annotations

import argparse
import json
import os

import tensorflow as tf

PER_WORKER_BATCH = 32
CLASSES = 4


def mnist_like_dataset(batch_size: int) -> tf.data.Dataset:
    """28x28 images: class k is a bright band at rows 7k..7k+6, plus noise."""

    def sample(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        label = tf.cast(i % CLASSES, tf.int32)
        rows = tf.cast(tf.range(28) // 7 == label, tf.float32)
        noise = tf.random.stateless_uniform([28, 28], seed=[7, i])
        return 0.6 * noise + 0.4 * rows[:, None], label

    return tf.data.Dataset.range(1_000_000).map(sample).batch(batch_size)


def build_and_compile_cnn_model() -> tf.keras.Model:
    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(28, 28)),
            tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(8, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.05),
        metrics=["accuracy"],
    )
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    args = parser.parse_args()

    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers = len(tf_config["cluster"].get("worker", [])) + len(
        tf_config["cluster"].get("chief", [])
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch_size = PER_WORKER_BATCH * num_workers
    multi_worker_dataset = mnist_like_dataset(global_batch_size)
    with strategy.scope():
        multi_worker_model = build_and_compile_cnn_model()
    history = multi_worker_model.fit(
        multi_worker_dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=2
    )

    task_type = strategy.cluster_resolver.task_type
    if task_type in (None, "chief"):
        result = {
            "accuracy": float(history.history["accuracy"][-1]),
            "loss": float(history.history["loss"][-1]),
            "epochs": args.epochs,
            "replicas": strategy.num_replicas_in_sync,
            "keras": tf.keras.__name__.split(".")[0],
        }
        with open(os.path.join(os.environ.get("TFCLUSTER_RUN_DIR", "."), "result.json"), "w") as f:
            json.dump(result, f, indent=2)
        print(f"accuracy {result['accuracy']:.3f} over {result['replicas']} replicas", flush=True)


if __name__ == "__main__":
    main()
