"""``HostedDense``: with ``hosted`` set, the same outputs and gradients as
without, its products (forward and both gradients) and, in bfloat16, the
kernel's casts both ways placed on the kernel's device; nothing placed
while it is not hosted."""

from __future__ import annotations

import numpy as np
import pytest


def _run(hosted: bool, policy: str) -> tuple[list[np.ndarray], list[str], list[str], str]:
    """(output, gradients of input, kernel and bias; devices of the traced
    MatMul ops; devices of the casts that make the kernel's gradient
    float32; the kernel's device)."""
    import keras
    import tensorflow as tf

    from trainer.models.hosting import HostedDense, host_dense_layers, variable_device

    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((6,)), HostedDense(4, activation="relu")])
    finally:
        keras.mixed_precision.set_global_policy(before)
    if hosted:
        assert host_dense_layers(model) == 1
    layer = model.layers[0]
    x = tf.constant(np.random.default_rng(0).normal(size=(3, 6)).astype(np.float32))

    @tf.function
    def step(x: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.cast(model(x), tf.float32)
            loss = tf.reduce_sum(y * tf.range(1.0, 5.0))
        return [y, *tape.gradient(loss, [x, layer.kernel.value, layer.bias.value])]

    values = [np.asarray(t) for t in step(x)]
    assert values[2].dtype == np.float32  # the kernel's gradient, as the kernel
    ops = step.get_concrete_function(x).graph.get_operations()
    products = [op.device for op in ops if op.type == "MatMul"]
    # The kernel's gradient: x^T @ dy, cast to float32.
    widened = [
        op.device
        for op in ops
        if op.type == "Cast"
        and op.inputs[0].op.type == "MatMul"
        and op.inputs[0].op.get_attr("transpose_a")
        and op.outputs[0].dtype == tf.float32
    ]
    device = tf.DeviceSpec.from_string(variable_device(layer._kernel)).to_string()
    return values, products, widened, device


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_a_hosted_dense_computes_as_a_plain_one_beside_its_kernel(policy: str) -> None:
    import tensorflow as tf

    plain, plain_products, _, _ = _run(False, policy)
    hosted, products, widened, device = _run(True, policy)
    for a, b in zip(plain, hosted, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-6)
    assert np.abs(hosted[2]).sum() > 0  # the kernel's gradient is not all zero
    assert set(plain_products) == {""}
    # The forward product and both gradient products on the kernel's device,
    # and in bfloat16 the kernel gradient's cast back to float32 too.
    assert len(products) == 3, products
    assert {tf.DeviceSpec.from_string(d).to_string() for d in products} == {device}
    if policy == "mixed_bfloat16":
        assert [tf.DeviceSpec.from_string(d).to_string() for d in widened] == [device]
