"""A collective (all-reduce) program, written as TensorFlow's guide writes one.

Every task (the chief and each worker) runs this same file with its own
TF_CONFIG and trains the same model: MultiWorkerMirroredStrategy all-reduces
the gradients every step, so all replicas stay identical. There is no ps:
start it with `deploy.py run --no-ps`. The chief writes the result into
$TFCLUSTER_RUN_DIR, the folder that comes home.

It learns to tell MNIST-like blobs apart from synthetic data (no download),
so result.json's `accuracy` ends near 1.

    deploy.py run --no-ps -- python collective_program.py --steps 200
"""

from __future__ import annotations

import argparse
import json
import os
import time

import tensorflow as tf

BATCH_PER_REPLICA = 32
CLASSES = 4


def dataset(seed: int) -> tf.data.Dataset:
    """Four classes: noisy points around four centres in 16 dimensions."""
    centres = tf.random.stateless_normal([CLASSES, 16], seed=[seed, 0]) * 3.0

    def sample(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        label = i % CLASSES
        noise = tf.random.stateless_normal([16], seed=[seed, i + 1])
        return tf.gather(centres, label) + noise, label

    return tf.data.Dataset.range(1_000_000).map(sample)


def distributed_batches(
    strategy: tf.distribute.Strategy, global_batch: int
) -> tf.distribute.DistributedIterator:
    """Each task reads its own share of every global batch."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    data = dataset(seed=7).batch(global_batch).with_options(options)
    return iter(strategy.experimental_distribute_dataset(data))


def write_result(
    resolver: tf.distribute.cluster_resolver.ClusterResolver,
    accuracy: float,
    steps: int,
    replicas: int,
    seconds: float,
) -> None:
    """The chief's result.json, in the folder that comes home."""
    cluster = resolver.cluster_spec().as_dict()
    result = {
        "accuracy": accuracy,
        "steps": steps,
        "replicas": replicas,
        "seconds": seconds,
        "cluster": {kind: len(addresses) for kind, addresses in cluster.items()},
    }
    out = os.environ.get("TFCLUSTER_RUN_DIR", ".")
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(f"accuracy {accuracy:.3f} over {replicas} replicas", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    replicas = strategy.num_replicas_in_sync
    global_batch = BATCH_PER_REPLICA * replicas

    batches = distributed_batches(strategy, global_batch)

    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input([16]),
                tf.keras.layers.Dense(32, "relu"),
                tf.keras.layers.Dense(CLASSES),
            ]
        )
        optimizer = tf.keras.optimizers.SGD(0.05)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )

    @tf.function
    def step(batch: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                per_example = loss_fn(y, logits)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            hits = tf.cast(tf.equal(tf.argmax(logits, 1), tf.cast(y, tf.int64)), tf.float32)
            return tf.reduce_sum(hits)

        hits = strategy.run(replica_step, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, hits, axis=None) / global_batch

    began = time.monotonic()
    accuracy = 0.0
    for _ in range(args.steps):
        accuracy = float(step(next(batches)))

    if resolver.task_type in (None, "chief"):
        seconds = round(time.monotonic() - began, 2)
        write_result(resolver, accuracy, args.steps, replicas, seconds)


if __name__ == "__main__":
    main()
