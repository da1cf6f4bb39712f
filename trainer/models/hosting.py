"""Dense layers computed where their weights live (async mode's ps).

In async mode a worker step reads every parameter from the ps and pushes
every gradient back. The cnn's hidden dense layer holds 3.2 of its 3.3
million parameters: 12.8 MB read and 12.8 MB pushed per step, and the
layer's three matrix products (forward, and the gradients of its input and
its weights), about a fifth of the step's computation, done on the worker's
core. ``HostedDense`` with ``hosted`` set computes the product on the task
that holds its kernel instead (TensorFlow 1's placement by default: ops
colocated with their variables): what crosses is the layer's input and
output and their gradients (128 x 3136 and 128 x 1024 floats, 2.1 MB each
way for the cnn), the kernel's gradient is made beside the kernel, and the
worker's core computes the rest. The arithmetic is the same products of the
same values (``tf.matmul``'s own gradient, written out), so training is
unchanged; only the places differ.

Measured on bench/peers.py's async set-up (ps + 2 workers + chief; the two
workers share one core, the ps and the chief the other, as bench/trainer.py
pins them; a 2-core machine at load 4.5-18), CPU per global step: the
workers' core 121-128 -> 91-103 ms, the ps's 23-28 -> 50-57 ms (float32); with
``--bfloat16`` 84 -> 64-66 and 27 -> 38-42 ms (README). The workers' core
was the bound, so the step got faster although the job's CPU in all did not
shrink (in float32). It suits a ps with cores to spare: a ps serving many
workers, or workers with GPUs, would compute on the ps's CPU what the
workers do faster; hence ``--no-dense-on-ps``.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf


def matmul_on(device: str, x: tf.Tensor, w: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """``x @ w`` computed in ``dtype`` and, under a gradient tape, both of
    its gradients, all on ``device``; ``w``'s cast to ``dtype`` and its
    gradient's cast back too (a tape places the gradients, casts included,
    wherever the backward pass runs: the worker, where the kernel's
    gradient would cross twice)."""

    @tf.custom_gradient
    def product(x: tf.Tensor, w: tf.Tensor) -> Any:
        with tf.device(device):
            narrow = tf.cast(w, dtype)
            y = tf.matmul(tf.cast(x, dtype), narrow)

        def grad(dy: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            with tf.device(device):
                dx = tf.matmul(dy, narrow, transpose_b=True)
                dw = tf.matmul(tf.cast(x, dtype), dy, transpose_a=True)
                return tf.cast(dx, x.dtype), tf.cast(dw, w.dtype)

        return y, grad

    return product(x, w)


def variable_device(variable: keras.Variable) -> str:
    """The device of the TensorFlow variable under a Keras one."""
    return str(variable._value.device)  # Keras has no public accessor


class HostedDense(keras.layers.Dense):
    """``keras.layers.Dense`` whose product runs beside its kernel once
    ``hosted`` is set (``AsyncMode``); Keras' arithmetic here otherwise
    (every other mode, where the kernel is this replica's own). Its
    variables are not autocast: ``call`` casts them to the compute dtype
    itself, so that a hosted kernel is cast where it lives."""

    hosted = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["autocast"] = False
        super().__init__(*args, **kwargs)

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        dtype = self.compute_dtype
        # Cast as Keras casts a layer's inputs where it autocasts.
        inputs = keras.ops.cast(inputs, dtype)
        if self.hosted and len(inputs.shape) == 2:
            device = variable_device(self._kernel)
            with tf.device(device):
                kernel = tf.convert_to_tensor(self.kernel)
            x = matmul_on(device, inputs, kernel, tf.as_dtype(dtype))
        else:
            x = keras.ops.matmul(inputs, keras.ops.cast(self.kernel, dtype))
        if self.bias is not None:
            x = keras.ops.add(x, keras.ops.cast(self.bias, dtype))
        return self.activation(x) if self.activation is not None else x


def host_dense_layers(model: keras.Model) -> int:
    """Set ``hosted`` on every ``HostedDense`` of ``model``; how many."""
    layers = [layer for layer in model._flatten_layers() if isinstance(layer, HostedDense)]
    for layer in layers:
        layer.hosted = True
    return len(layers)
