"""Cross-worker parameter collectives of the sync and average modes.

Both run as one batched all-reduce of MultiWorkerMirroredStrategy inside
``strategy.run``, then assign the result in cross-replica context (which
writes every local copy of a mirrored variable, or the one local variable of
average mode's private replica):

* ``average``: MEAN of every worker's parameters, written back everywhere:
  parameter averaging (source E), after each worker's K local steps.
* ``broadcast``: the chief's values to all workers (SUM where only the
  chief's first replica contributes non-zeros). Used after ``--resume``,
  where only the chief has read the checkpoint (the workers' nodes need not
  share its file system), and to start average mode's replicas identical.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from trainer.distribution.strategy import ClusterInfo

# tf.Variables, mirrored variables or Keras variables: all convert to a
# tensor and assign the same way.
Variable = Any


def _reduce_and_assign(
    strategy: tf.distribute.Strategy,
    variables: Sequence[Variable],
    contribution: Callable[[tf.distribute.ReplicaContext, Variable], tf.Tensor],
    op: tf.distribute.ReduceOp,
) -> Callable[[], None]:
    """``fn()`` that all-reduces every variable's ``contribution`` with ``op``
    and assigns the result."""

    @tf.function
    def run() -> None:
        def replica() -> list[tf.Tensor]:
            context = tf.distribute.get_replica_context()
            assert context is not None
            values = [contribution(context, v) for v in variables]
            # Integer state (step counters) travels as float64: exact below
            # 2**53, and every collective implementation reduces it. A
            # batched all-reduce concatenates its tensors, so one per dtype.
            values = [tf.cast(x, tf.float64) if x.dtype.is_integer else x for x in values]
            reduced: list[tf.Tensor | None] = [None] * len(values)
            for dtype in sorted({x.dtype for x in values}, key=str):
                positions = [i for i, x in enumerate(values) if x.dtype == dtype]
                out = context.all_reduce(op, [values[i] for i in positions])
                for i, x in zip(positions, out, strict=True):
                    reduced[i] = x
            return reduced

        reduced = strategy.run(replica)
        for variable, value in zip(variables, reduced, strict=True):
            local = strategy.experimental_local_results(value)[0]
            variable.assign(tf.cast(local, variable.dtype))

    return run


def averager(strategy: tf.distribute.Strategy, variables: Sequence[Variable]) -> Callable[[], None]:
    """``fn()`` that replaces ``variables`` by their mean over all workers."""

    # A SUM of pre-scaled values: MultiWorkerMirroredStrategy's replica-context
    # MEAN insists on distributed destinations, which local variables lack.
    def contribution(context: tf.distribute.ReplicaContext, v: Variable) -> tf.Tensor:
        value = tf.convert_to_tensor(v)
        return value / tf.cast(context.num_replicas_in_sync, value.dtype)

    return _reduce_and_assign(strategy, variables, contribution, tf.distribute.ReduceOp.SUM)


def broadcaster(
    strategy: tf.distribute.Strategy, variables: Sequence[Variable]
) -> Callable[[], None]:
    """``fn()`` that gives every worker the chief's ``variables``."""

    def contribution(context: tf.distribute.ReplicaContext, v: Variable) -> tf.Tensor:
        value = tf.convert_to_tensor(v)
        source = tf.equal(context.replica_id_in_sync_group, 0)
        return tf.where(source, value, tf.zeros_like(value))

    return _reduce_and_assign(strategy, variables, contribution, tf.distribute.ReduceOp.SUM)


def barrier(strategy: tf.distribute.Strategy) -> None:
    """Wait until every worker gets here (a one-number all-reduce)."""

    @tf.function
    def run() -> None:
        strategy.run(
            lambda: tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, tf.constant(1.0)
            )
        )

    run()


# How long the chief waits for a worker's goodbye before leaving anyway.
LEAVE_TIMEOUT_S = 60


def leave_together(info: ClusterInfo) -> None:
    """The goodbye of a collective job, after its final barrier; then every
    task exits at once, without TensorFlow's teardown (``os._exit``).

    The coordination service lives in the chief. A chief that leaves first
    can cut off a worker's end of the final all-reduce, and a worker whose
    chief is gone hangs in teardown until a heartbeat times out (about
    30 s). So each worker's last act is a message the chief acknowledges
    (a key set in the service), and the chief leaves once every worker's
    key is there.
    """
    from tensorflow.python.eager import context

    ctx = context.context()
    task_name, chief = info.name, info.chief_name
    if task_name != chief:
        try:
            ctx.set_config_key_value(f"tfcluster/done/{task_name}", "1")
        except tf.errors.OpError as e:
            # Training is over and the chief has its results: a chief gone
            # by now costs nothing but this line.
            print(f"trainer: {task_name}: no goodbye to {chief} ({type(e).__name__}); "
                  "leaving anyway", flush=True)  # fmt: skip
        return
    for name in info.training_tasks():
        if name == chief:
            continue
        try:
            ctx.get_config_key_value(f"tfcluster/done/{name}", LEAVE_TIMEOUT_S * 1000)
        except tf.errors.OpError as e:
            print(f"trainer: {task_name}: no goodbye from {name} ({type(e).__name__}); "
                  "leaving anyway", flush=True)  # fmt: skip
