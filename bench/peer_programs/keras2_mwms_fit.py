"""Peer: Keras ``Model.fit`` under ``MultiWorkerMirroredStrategy``, as
TensorFlow's multi-worker Keras tutorial writes it: every task (chief and
workers) runs this program, builds and compiles the model in the
strategy's scope and fits on a ``tf.data.Dataset`` of the global batch
(``--batch-size`` per replica), which the strategy shards across the
workers.

Keras 2 (``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``, as the tutorial's):
Keras 3.15's fit under this strategy (TensorFlow 2.21) fails at its first
step here ("Attempt to convert a value (PerReplica:...) with an unsupported
type ... to a Tensor"), so a user of fit with all-reduce has Keras 2.

Run by bench/peers.py on every task of a local cluster (TF_CONFIG)."""

from __future__ import annotations

import json
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is Keras 2 (tf_keras)

import tensorflow as tf

from bench.peer_programs import common


def main() -> None:
    args = common.parse(__doc__.split("\n\n")[0])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    keras = tf.keras

    images, labels = common.mnist(args.data_dir)
    global_batch = args.batch_size * strategy.num_replicas_in_sync
    data = (
        tf.data.Dataset.from_tensor_slices((images, labels))
        .shuffle(len(labels))
        .repeat()
        .map(common.to_inputs)
        .batch(global_batch)
        .prefetch(2)
    )
    with strategy.scope():
        model = common.cnn(keras)
        model.compile(
            keras.optimizers.Adam(1e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=args.steps_per_execution,
        )
    model.fit(data, epochs=1, steps_per_epoch=args.warmup, verbose=0)
    timer = common.timer(keras)
    steps = args.steps - args.warmup
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[timer])
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    if task.get("type", "chief") == "chief":
        common.report(steps, global_batch, timer.seconds, keras=common.keras_version(keras))
    os._exit(0)  # every task has finished the same steps: no collective is left


if __name__ == "__main__":
    main()
