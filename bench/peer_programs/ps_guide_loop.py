"""Peer: the custom training loop of TensorFlow's parameter-server guide
("Training with a custom training loop"): a ``ClusterCoordinator``, a
per-worker dataset, and ``coordinator.schedule`` of a ``tf.function`` that
runs one step (``strategy.run`` of the replica's step), ``join`` at the
end; Keras 2 layers and optimizer (``tf.keras`` under
``TF_USE_LEGACY_KERAS=1``), as the guide's.

Run by bench/peers.py on every task of a local cluster (TF_CONFIG)."""

from __future__ import annotations

import os
import time
from typing import Any

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is Keras 2 (tf_keras)

import tensorflow as tf

from bench.peer_programs import common


def main() -> None:
    args = common.parse(__doc__.split("\n\n")[0])
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    common.serve_if_server(resolver)
    keras = tf.keras
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    images, labels = common.mnist(args.data_dir)

    dataset_fn = common.ps_dataset_fn(images, labels, args.batch_size)

    with strategy.scope():
        model = common.cnn(keras)
        optimizer = keras.optimizers.Adam(1e-3)
        accuracy = keras.metrics.SparseCategoricalAccuracy()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=keras.losses.Reduction.NONE
    )

    @tf.function
    def per_worker_dataset_fn() -> Any:
        return strategy.distribute_datasets_from_function(dataset_fn)

    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    per_worker_iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    @tf.function
    def step_fn(iterator: Any) -> Any:
        def replica_fn(batch: Any) -> Any:
            x, y = batch
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.nn.compute_average_loss(loss_fn(y, logits))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            accuracy.update_state(y, logits)
            return loss

        losses = strategy.run(replica_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    for _ in range(args.warmup):
        coordinator.schedule(step_fn, args=(per_worker_iterator,))
    coordinator.join()
    steps = args.steps - args.warmup
    began = time.perf_counter()
    for _ in range(steps):
        coordinator.schedule(step_fn, args=(per_worker_iterator,))
    coordinator.join()
    seconds = time.perf_counter() - began
    common.report(steps, args.batch_size, seconds, keras=common.keras_version(keras))
    os._exit(0)


if __name__ == "__main__":
    main()
