"""The training step, and many steps per ``tf.function`` call.

One design for every mode (Keras 3 layers and optimizers, ``strategy.run``
inside a ``tf.function``): Keras 3's ``model.fit`` supports neither
ParameterServerStrategy nor, in our tests, MultiWorkerMirroredStrategy, and
``tf_keras`` needs the full ``tensorflow`` wheel, so the loop is our own.

A replica step reads the current values of all model variables (from the
parameter server, the replica's mirrored copy or the local copy: whatever
``strategy.run`` resolves them to), computes loss and gradients of the
phase's variables as a pure function of those values inside a Keras
``StatelessScope`` (optionally XLA-compiled, which a parameter server's
remote variables would otherwise forbid), and hands the gradients to the
phase's Keras optimizer. Keras 3's TensorFlow optimizer all-reduces (sums)
gradients across replicas itself when called in a replica context of a
mirrored strategy, so the loss is scaled by the global batch
(``tf.nn.compute_average_loss``) to make that sum the global mean gradient.
Under ParameterServerStrategy the update is applied on the ps as it arrives
(async SGD); under the default strategy it is a local update.

``train_calls`` loops ``k`` steps inside one ``tf.function`` (Keras'
steps_per_execution): one Python round trip, one closure to schedule in async
mode, per ``k`` steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
import tensorflow as tf

from trainer.models.base import Batch, Phase

# (sum of step losses, sums of step metrics, steps run) of one call.
CallResult = tuple[tf.Tensor, dict[str, tf.Tensor], tf.Tensor]


def replica_step(
    phase: Phase,
    optimizer: keras.optimizers.Optimizer,
    variables: Sequence[keras.Variable],
    step: tf.Variable,
    jit: bool,
) -> Callable[[Batch], tuple[tf.Tensor, dict[str, tf.Tensor]]]:
    """``fn(batch) -> (mean loss, metrics)`` that trains ``phase`` one step.
    ``variables`` are all the model's variables (a loss may read any of them,
    e.g. the frozen first layer while the second is pretrained)."""
    position = {id(v): i for i, v in enumerate(variables)}
    trained = [position[id(v)] for v in phase.variables]

    def forward_backward(
        values: list[tf.Tensor], batch: Batch
    ) -> tuple[tf.Tensor, list[tf.Tensor], dict[str, tf.Tensor]]:
        watched = [values[i] for i in trained]
        with tf.GradientTape() as tape:
            tape.watch(watched)
            with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
                per_example, metrics = phase.loss(batch)
            scaled = tf.nn.compute_average_loss(per_example)
        grads = tape.gradient(scaled, watched)
        return tf.reduce_mean(per_example), grads, metrics

    compute = tf.function(forward_backward, jit_compile=True) if jit else forward_backward

    def step_fn(batch: Batch) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        values = [tf.convert_to_tensor(v) for v in variables]
        loss, grads, metrics = compute(values, batch)
        optimizer.apply(grads, phase.variables)
        step.assign_add(1)
        return loss, metrics

    return step_fn


def train_calls(
    strategy: tf.distribute.Strategy,
    phase: Phase,
    optimizer: keras.optimizers.Optimizer,
    variables: Sequence[keras.Variable],
    step: tf.Variable,
    *,
    jit: bool,
    guard: bool,
) -> Callable[[object, tf.Tensor, tf.Tensor], CallResult]:
    """``call(iterator, k, limit)``: run up to ``k`` steps of ``phase``.

    With ``guard`` (async mode) each step first checks the global step
    against ``limit``, so closures that run late, or again after their worker
    died, stop at the phase's end instead of overshooting it by whole calls
    (concurrent workers can still overshoot by at most one step each).
    The loss and metrics returned are this process's replicas' own: reducing
    them across workers every step would add a collective per step.
    """
    run_step = replica_step(phase, optimizer, variables, step, jit)

    def local_mean(value: object) -> tf.Tensor:
        parts = strategy.experimental_local_results(value)
        return tf.add_n(list(parts)) / len(parts)

    @tf.function
    def call(iterator: object, k: tf.Tensor, limit: tf.Tensor) -> CallResult:
        loss_sum = tf.constant(0.0)
        sums = {name: tf.constant(0.0) for name in phase.metric_names}
        done = tf.constant(0, tf.int64)
        for _ in tf.range(k):
            if not guard or step < limit:
                loss, metrics = strategy.run(run_step, args=(next(iterator),))  # type: ignore[call-overload]
                loss_sum += local_mean(loss)
                sums = {name: sums[name] + local_mean(metrics[name]) for name in sums}
                done += 1
        return loss_sum, sums, done

    return call
