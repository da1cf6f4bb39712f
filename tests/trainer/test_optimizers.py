"""``FusedAdam`` takes the very steps Keras' Adam takes (TensorFlow's fused
kernel for the same arithmetic), with a constant and a scheduled rate."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("schedule", [False, True])
def test_fused_adam_steps_as_keras_adam(schedule: bool) -> None:
    import keras

    from trainer.loop.optimizers import FusedAdam

    rng = np.random.default_rng(0)
    start = rng.normal(size=(7, 5)).astype(np.float32)
    grads = [rng.normal(size=(7, 5)).astype(np.float32) for _ in range(6)]
    results = []
    for kind in (keras.optimizers.Adam, FusedAdam):
        rate = keras.optimizers.schedules.CosineDecay(0.01, 6) if schedule else 0.01
        variable = keras.Variable(start)
        optimizer = kind(rate)
        for grad in grads:
            optimizer.apply([keras.ops.convert_to_tensor(grad)], [variable])
        results.append(
            [np.asarray(variable.numpy()), *(np.asarray(s.numpy()) for s in optimizer.variables[1:])]
        )
    assert not np.allclose(results[1][0], start)  # it moved
    for keras_value, fused_value in zip(*results, strict=True):
        np.testing.assert_allclose(fused_value, keras_value, rtol=1e-5, atol=1e-7)
