"""Peer: Keras 2 ``Model.fit`` under ``ParameterServerStrategy``, as
TensorFlow's parameter-server guide writes it ("Training with Model.fit"):
ps and worker tasks run a ``tf.distribute.Server``; the chief builds the
model in the strategy's scope, compiles it with ``steps_per_execution``
(Keras' advice for small models: many steps per scheduled function) and
fits on a ``DatasetCreator``. Keras 3's fit has no parameter-server
support, hence Keras 2 (``tf_keras``, ``TF_USE_LEGACY_KERAS=1``).

Run by bench/peers.py on every task of a local cluster (TF_CONFIG)."""

from __future__ import annotations

import os

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
        model.compile(
            keras.optimizers.Adam(1e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=args.steps_per_execution,
        )
    data = keras.utils.experimental.DatasetCreator(dataset_fn)
    model.fit(data, epochs=1, steps_per_epoch=args.warmup, verbose=0)
    timer = common.timer(keras)
    steps = args.steps - args.warmup
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[timer])
    common.report(steps, args.batch_size, timer.seconds, keras=common.keras_version(keras))
    os._exit(0)  # the coordinator's threads would delay the exit


if __name__ == "__main__":
    main()
