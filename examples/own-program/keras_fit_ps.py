"""Keras `model.fit` under ParameterServerStrategy, as TensorFlow's
parameter-server tutorial writes it: the ps and the workers only serve
(`tf.distribute.Server(...).join()`), the chief builds the model in the
strategy's scope and `fit` schedules the steps on the workers through a
ClusterCoordinator of its own; the variables live on the ps.

It uses `tf.keras` and never imports `keras` itself, so tfcluster runs it
with TF_USE_LEGACY_KERAS=1: `tf.keras` is then Keras 2 (the tf-keras package,
installed on every node at TensorFlow's version). Keras 3's `fit` has no
ParameterServerStrategy at all; with Keras 3, write the loop yourself
(ps_program.py). The chief writes result.json into $TFCLUSTER_RUN_DIR.

    deploy.py run -- python keras_fit_ps.py --epochs 3
"""

from __future__ import annotations

import argparse
import json
import os

import tensorflow as tf

CLASSES = 4


def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    """Each worker's own stream of batches: 16 features, class k centred at k."""
    batch = input_context.get_per_replica_batch_size(64)

    def sample(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        label = tf.cast(i % CLASSES, tf.int32)
        noise = tf.random.stateless_normal([16], seed=[input_context.input_pipeline_id, i])
        return tf.cast(label, tf.float32) * 2.0 + 0.5 * noise, label

    data = tf.data.Dataset.range(1_000_000).map(sample).batch(batch)
    return data.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)


def serve(resolver: tf.distribute.cluster_resolver.ClusterResolver) -> None:
    """A ps or a worker: hold variables or run the steps sent to it, until stopped."""
    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    server.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    args = parser.parse_args()

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        serve(resolver)
        return

    strategy = tf.distribute.ParameterServerStrategy(resolver)
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Dense(32, activation="relu", input_shape=(16,)),
                tf.keras.layers.Dense(CLASSES),
            ]
        )
        model.compile(
            optimizer=tf.keras.optimizers.SGD(learning_rate=0.05),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=5,
        )
    history = model.fit(
        tf.keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        verbose=2,
    )
    result = {
        "accuracy": float(history.history["accuracy"][-1]),
        "loss": float(history.history["loss"][-1]),
        "epochs": args.epochs,
        "ps": len(resolver.cluster_spec().as_dict().get("ps", [])),
        "keras": tf.keras.__name__.split(".")[0],
    }
    with open(os.path.join(os.environ.get("TFCLUSTER_RUN_DIR", "."), "result.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(f"accuracy {result['accuracy']:.3f} with {result['ps']} ps", flush=True)


if __name__ == "__main__":
    main()
