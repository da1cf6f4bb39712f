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

With mixed precision the phase's optimizer is a Keras
``LossScaleOptimizer``: the loss is multiplied by its dynamic scale before
the gradients are taken (float16 gradients would otherwise underflow), and
the optimizer divides them back, skipping the update and halving the scale
when any gradient is not finite. Each replica checks only its own
gradients, so the replicas first agree on whether all of them are finite
(``agree_on_finite``): one replica applying an update while another skips
it would leave the mirrored copies apart, and the optimizer's all-reduce
waiting for a replica that never comes.

``train_calls`` loops ``k`` steps inside one ``tf.function`` (Keras'
steps_per_execution): one Python round trip, one closure to schedule in async
mode, per ``k`` steps. ``overlapped_calls`` (async, ``--overlap``) does the
same with each step's computation overlapping the previous step's update.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.common.stateless_scope import in_stateless_scope

from trainer.models.base import Batch, Phase


class AtomicCounter(keras.Variable):
    """A Keras optimizer's iteration count, incremented atomically.

    Keras counts an optimizer's iterations with ``Variable.assign_add``,
    which Keras implements as ``assign(self + 1)``: a read, then a write.
    In async mode the workers apply their updates to the ps concurrently, so
    two of them read the same count and one increment is lost (98 counted
    for 100 steps applied; Adam's bias correction reads that count too).
    TensorFlow's own ``assign_add`` is one atomic operation on the ps, like
    the global step's."""

    def assign_add(self, value: Any) -> Any:
        if in_stateless_scope():
            return super().assign_add(value)
        return self._value.assign_add(tf.cast(value, self._value.dtype))


def count_atomically(optimizer: keras.optimizers.Optimizer) -> None:
    """Make ``optimizer`` count its iterations with ``AtomicCounter``: its
    class is swapped in place, since the optimizer tracks (and checkpoints)
    the very variable object it created."""
    counter = optimizer._iterations  # no public hook for the counter
    if type(counter) is not keras.Variable:
        raise TypeError(f"unexpected optimizer iteration counter {type(counter).__name__}")
    counter.__class__ = AtomicCounter


# (sum of step losses, sums of step metrics, steps run) of one call.
CallResult = tuple[tf.Tensor, dict[str, tf.Tensor], tf.Tensor]


Compute = Callable[
    [list[tf.Tensor], Batch, tf.Tensor],
    tuple[tf.Tensor, list[tf.Tensor], dict[str, tf.Tensor]],
]

NO_SCALING = 1.0


def gradient_fn(phase: Phase, variables: Sequence[keras.Variable], jit: bool) -> Compute:
    """``fn(values, batch, scale) -> (mean loss, gradients of the phase's
    variables times ``scale``, metrics)``: a pure function of the values of
    all the model's ``variables`` (a loss may read any of them, e.g. the
    frozen first layer while the second is pretrained)."""
    position = {id(v): i for i, v in enumerate(variables)}
    trained = [position[id(v)] for v in phase.variables]

    def forward_backward(
        values: list[tf.Tensor], batch: Batch, scale: tf.Tensor
    ) -> tuple[tf.Tensor, list[tf.Tensor], dict[str, tf.Tensor]]:
        watched = [values[i] for i in trained]
        with tf.GradientTape() as tape:
            tape.watch(watched)
            with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
                per_example, metrics = phase.loss(batch)
            scaled = tf.nn.compute_average_loss(per_example) * scale
        grads = tape.gradient(scaled, watched)
        return tf.reduce_mean(per_example), grads, metrics

    # Without autograph, as the train call that runs it without --jit: the
    # model and the losses have no Python control flow on tensors, and
    # converting them only lengthened the first step.
    if jit:
        return tf.function(forward_backward, jit_compile=True, autograph=False)
    return forward_backward


def read_values(variables: Sequence[keras.Variable]) -> list[tf.Tensor]:
    """The variables' current values, from wherever they live (a ps, a
    mirrored replica, this process)."""
    return [tf.convert_to_tensor(v) for v in variables]


def loss_scale(optimizer: keras.optimizers.Optimizer) -> tf.Tensor:
    """The factor the loss is multiplied by before the gradients: the
    dynamic scale of a ``LossScaleOptimizer``, else 1."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return tf.convert_to_tensor(optimizer.dynamic_scale)
    return tf.constant(NO_SCALING)


def agree_on_finite(grads: list[tf.Tensor]) -> list[tf.Tensor]:
    """The gradients, made non-finite on every replica when any replica's
    are (one scalar all-reduce), so that every replica's loss-scale
    optimizer skips the same steps."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return grads
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
    bad = context.all_reduce(tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(finite, tf.float32))
    poison = tf.where(bad > 0, float("nan"), 0.0)
    return [g + tf.cast(poison, g.dtype) for g in grads]


def replica_step(
    phase: Phase,
    optimizer: keras.optimizers.Optimizer,
    variables: Sequence[keras.Variable],
    step: tf.Variable,
    jit: bool,
) -> Callable[[Batch], tuple[tf.Tensor, dict[str, tf.Tensor]]]:
    """``fn(batch) -> (mean loss, metrics)`` that trains ``phase`` one step."""
    compute = gradient_fn(phase, variables, jit)
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

    def step_fn(batch: Batch) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        values = read_values(variables)
        loss, grads, metrics = compute(values, batch, loss_scale(optimizer))
        if scaled:
            grads = agree_on_finite(grads)
        optimizer.apply(grads, phase.variables)
        step.assign_add(1)
        return loss, metrics

    return step_fn


def claim_step(claims: tf.Variable, limit: tf.Tensor) -> tf.Tensor:
    """Whether an async step may run: it takes the next place from
    ``claims`` (a counter on the ps) and runs if that is within ``limit``.

    Checking the global step and adding to it once the step was applied let
    two workers both see step 119 of 120 and both run (121 steps: CI saw it
    after a worker was lost and its closure ran again). The add here is
    atomic (the variable's lock); the value read after it may hold other
    workers' adds made since, so it is at least this step's own place: a
    step that reads a value within the limit is within it, and none goes
    past. One that read past it while its own place was within is made up
    by the chief's next round, which sets ``claims`` back to the global step
    once no closure is in flight (``loops.run_async``).
    """
    return claims.assign_add(1, read_value=True) <= limit


def train_calls(
    strategy: tf.distribute.Strategy,
    phase: Phase,
    optimizer: keras.optimizers.Optimizer,
    variables: Sequence[keras.Variable],
    step: tf.Variable,
    *,
    jit: bool,
    claims: tf.Variable | None,
) -> Callable[[object, tf.Tensor, tf.Tensor], CallResult]:
    """``call(iterator, k, limit)``: run up to ``k`` steps of ``phase``.

    With ``claims`` (async mode) each step first claims its place
    (``claim_step``), so closures that run late, or again after their worker
    died, stop at the phase's end instead of overshooting it.
    The loss and metrics returned are this process's replicas' own: reducing
    them across workers every step would add a collective per step.
    """
    run_step = replica_step(phase, optimizer, variables, step, jit)

    def local_mean(value: object) -> tf.Tensor:
        parts = strategy.experimental_local_results(value)
        return tf.add_n(list(parts)) / len(parts)

    def one_step(totals: CallResult, iterator: object) -> CallResult:
        loss_sum, sums, done = totals
        loss, metrics = strategy.run(run_step, args=(next(iterator),))  # type: ignore[call-overload]
        sums = {name: sums[name] + local_mean(metrics[name]) for name in sums}
        return loss_sum + local_mean(loss), sums, done + 1

    # Written as the graph it is (tf.while_loop, tf.cond), not converted by
    # autograph: converting this function and everything it calls (the
    # model, the loss, Keras' optimizer) took 0.4 s of the first step's
    # 1.0 s of tracing, on the chief's path from the command to the first
    # step (bench/startup.py).
    @tf.function(autograph=False)
    def call(iterator: object, k: tf.Tensor, limit: tf.Tensor) -> CallResult:
        def body(i: tf.Tensor, totals: CallResult) -> tuple[tf.Tensor, CallResult]:
            if claims is not None:
                totals = tf.cond(
                    claim_step(claims, limit), lambda: one_step(totals, iterator), lambda: totals
                )
            else:
                totals = one_step(totals, iterator)
            return i + 1, totals

        zero = tf.constant(0.0)
        totals = (zero, dict.fromkeys(phase.metric_names, zero), tf.constant(0, tf.int64))
        _, totals = tf.while_loop(lambda i, _: i < k, body, (tf.zeros_like(k), totals))
        return totals

    return call


def overlapped_calls(
    strategy: tf.distribute.Strategy,
    phase: Phase,
    optimizer: keras.optimizers.Optimizer,
    variables: Sequence[keras.Variable],
    step: tf.Variable,
    *,
    jit: bool,
    claims: tf.Variable,
) -> Callable[[object, tf.Tensor, tf.Tensor], CallResult]:
    """``call(iterator, k, limit)`` for async mode with one replica per
    worker: up to ``k`` steps of ``phase``, each step's gradients computed
    while the ps applies the previous step's (``_Overlapped`` says how and
    what it costs). The last step of a call is applied before the call
    returns, so a finished closure leaves all of its steps on the ps.
    """
    if strategy.num_replicas_in_sync != 1:
        raise ValueError("overlapped steps need one replica per worker")
    parts = _Overlapped(strategy, phase, optimizer, variables, step, jit)

    @tf.function
    def call(iterator: object, k: tf.Tensor, limit: tf.Tensor) -> CallResult:
        loss_sum = tf.constant(0.0)
        sums = {name: tf.constant(0.0) for name in phase.metric_names}
        done = tf.constant(0, tf.int64)
        values = parts.local(strategy.run(parts.read))
        pending = [tf.zeros_like(v) for v in phase.variables]
        has_pending = tf.constant(False)
        for _ in tf.range(k):
            if claim_step(claims, limit):
                batch = next(iterator)  # type: ignore[call-overload]
                # The previous step's update and this step's computation
                # share no data: the update (on the ps) and the computation
                # (here) run at the same time. The condition stays outside
                # strategy.run, where an optimizer update is not supported.
                if has_pending:
                    strategy.run(parts.apply, args=(pending,))
                loss, metrics, pending, values = parts.local(
                    strategy.run(parts.compute_step, args=(batch, values))
                )
                has_pending = tf.constant(True)
                loss_sum += loss
                sums = {name: sums[name] + metrics[name] for name in sums}
                done += 1
        if has_pending:
            strategy.run(parts.apply, args=(pending,))
        return loss_sum, sums, done

    return call


class _Overlapped:
    """The pieces of an overlapped step, traced into ``overlapped_calls``'s call.

    Done one after the other, as ``train_calls`` does, a step is: read the
    parameters from the ps, compute, send the gradients, wait while the ps
    applies them (Adam over every parameter), and only then read again; the
    worker idles for the update and the transfers. Here step i computes on
    the parameters as they were after step i - 2's update while step i - 1's
    update, and the read that follows it, run on the ps and the network.
    Each worker's gradients are one more update stale: with one worker as
    stale as with two in plain async SGD. Measured on loopback with 1 ps + 1
    worker, each on its own core: 9 % more examples/s; with 2 workers
    sharing 2 cores, no gain and a lower accuracy after 300 steps (0.964
    and 0.982 against 0.986 twice): hence opt-in (``--overlap``), for
    workers on machines of their own and networks slower than loopback.

    A step counts in the global step when its gradients are computed (its
    update is applied with the next step's, or at the call's end). A worker
    that dies mid-call loses that one counted update, as a plain step's
    gradients die with it.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        phase: Phase,
        optimizer: keras.optimizers.Optimizer,
        variables: Sequence[keras.Variable],
        step: tf.Variable,
        jit: bool,
    ) -> None:
        self.strategy = strategy
        self.phase = phase
        self.optimizer = optimizer
        self.variables = variables
        self.step = step
        self.compute = gradient_fn(phase, variables, jit)

    def local(self, structure: Any) -> Any:
        """The one replica's values of a per-replica ``structure``."""
        return tf.nest.map_structure(
            lambda t: self.strategy.experimental_local_results(t)[0], structure
        )

    def read(self) -> list[tf.Tensor]:
        return read_values(self.variables)

    def apply(self, grads: list[tf.Tensor]) -> None:
        # Gradients carried through the loop have lost their device, which
        # the optimizer's (here trivial) cross-replica sum needs: an identity
        # under the replica's device scope gives it back without a copy.
        self.optimizer.apply([tf.identity(g) for g in grads], self.phase.variables)

    def compute_step(
        self, batch: Batch, values: list[tf.Tensor]
    ) -> tuple[tf.Tensor, dict[str, tf.Tensor], list[tf.Tensor], list[tf.Tensor]]:
        loss, grads, metrics = self.compute(values, batch, tf.constant(NO_SCALING))
        self.step.assign_add(1)
        # TensorFlow's automatic control dependencies order this read after
        # the update applied just before (same variables): the next step
        # computes on it.
        return loss, metrics, grads, self.read()
