"""Adam in one fused kernel per variable.

Keras 3's Adam updates a variable with about ten element-wise operations
(``m += (g - m)(1 - b1)``, ``v += (g^2 - v)(1 - b2)``, ``x -= alpha m /
(sqrt(v) + eps)``, each read and written whole). In async mode these run
on the ps, for every step of every worker, on the CNN's 3.3 million
parameters, while the worker waits: bench/step_profile.py put the update
at 63 ms of a 198 ms step (1 worker, a loaded 2-core machine). TensorFlow's
``ResourceApplyAdam`` is the same arithmetic (Keras 2's Adam calls it) in
one pass over the four arrays. ``FusedAdam`` calls it where Keras 3 would
run its operations one by one: the same update, the same variables and
slots (checkpoints are unchanged), fewer passes over memory. Measured
alone on one core, the cnn's update took 6-8 ms instead of 16-19 ms; on
the ps of a loaded machine the profile could not tell the two apart
(38 and 35 ms in one run): what a step spends there is not all arithmetic.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf


def _handle(variable: Any) -> Any:
    """The TensorFlow resource handle under a Keras variable (or a slot)."""
    value = variable.value if isinstance(variable, keras.Variable) else variable
    return value.handle


class FusedAdam(keras.optimizers.Adam):
    """``keras.optimizers.Adam`` (without amsgrad) whose update of a dense
    float32 gradient is TensorFlow's fused kernel; anything else (float16
    variables, sparse gradients, amsgrad) goes Keras' own way."""

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> Any:
        if (
            self.amsgrad
            or isinstance(gradient, tf.IndexedSlices)
            or variable.dtype != "float32"
        ):
            return super().update_step(gradient, variable, learning_rate)
        dtype = tf.float32
        index = self._get_variable_index(variable)
        local_step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.constant(self.beta_1, dtype)
        beta_2 = tf.constant(self.beta_2, dtype)
        return tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable),
            m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=tf.pow(beta_1, local_step),
            beta2_power=tf.pow(beta_2, local_step),
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.constant(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype),
            use_locking=False,
        )
