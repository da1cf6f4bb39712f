"""Which training examples each worker sees, batch by batch.

Every input pipeline (one per worker) draws batches from its own endless
stream: epoch ``e`` of pipeline key ``k`` is a pseudo-random permutation of
the examples computed by ``tf.random.experimental.index_shuffle`` from
(k, e) alone. Nothing is materialised (not even a shuffle buffer), workers
with different keys see different orders, and batch ``b`` of a stream is a
pure function of (k, b): a resumed run that starts the stream at the batch
it had reached sees exactly the data it would have seen.

Each batch also carries ``seed`` = (k, b), from which the step derives its
dropout masks and noise with stateless RNG ops: no RNG state variable has to
be shared between replicas or kept on a parameter server.
"""

from __future__ import annotations

import sys

import tensorflow as tf

# Pipelines per key block: key = seed * KEY_BLOCK + salt * 4096 + pipeline.
KEY_BLOCK = 1 << 32


def stream_key(seed: int, pipeline: int | tf.Tensor, salt: int = 0) -> tf.Tensor:
    """One int64 key per (run seed, salt, input pipeline)."""
    return tf.cast(seed, tf.int64) * KEY_BLOCK + salt * 4096 + tf.cast(pipeline, tf.int64)


def worker_stream_key(seed: int, salt: int) -> tf.Tensor:
    """The key of an async worker's stream, drawn on the worker itself.

    ClusterCoordinator traces the dataset function once and runs that one
    graph on every worker (``create_per_worker_dataset``): nothing in it can
    tell the workers apart (``InputContext.input_pipeline_id`` is 0 on all of
    them, and seeded random ops draw the same numbers everywhere). Without
    this, N workers would train on the same batches N times. An unseeded
    draw (seed = seed2 = 0: seeded from the OS) made when the worker builds
    its dataset gives each worker its own stream.
    """
    pipeline = tf.raw_ops.RandomUniformInt(
        shape=tf.constant([], tf.int32),
        minval=tf.constant(0, tf.int64),
        maxval=tf.constant(KEY_BLOCK, tf.int64),
        seed=0,
        seed2=0,
    )
    return stream_key(seed, pipeline, salt)


def index_batches(
    num_examples: tf.Tensor | int, batch_size: int, start_batch: int, key: tf.Tensor
) -> tf.data.Dataset:
    """Endless dataset of ``{"batch": b, "index": int64[batch_size],
    "seed": int64[2]}`` from batch ``start_batch`` on."""
    n = tf.cast(num_examples, tf.int64)

    def to_indices(b: tf.Tensor) -> dict[str, tf.Tensor]:
        position = b * batch_size + tf.range(batch_size, dtype=tf.int64)
        epoch, offset = position // n, position % n
        # The raw op: the public wrapper pads a batch of seeds wrongly.
        seeds = tf.stack([tf.fill([batch_size], key), epoch, tf.zeros_like(epoch)], axis=1)
        index = tf.raw_ops.RandomIndexShuffle(index=offset, seed=seeds, max_index=n - 1)
        return {"batch": b, "index": index, "seed": tf.stack([key, b])}

    return tf.data.Dataset.range(start_batch, sys.maxsize).map(
        to_indices, num_parallel_calls=tf.data.AUTOTUNE
    )


def step_seed(seed: tf.Tensor, salt: int) -> tf.Tensor:
    """A distinct stateless seed per use (noise, each dropout) within a step."""
    return tf.random.experimental.stateless_fold_in(seed, salt)
