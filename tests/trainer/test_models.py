"""The models match the source material's architectures, and one training
call of the loop runs in-process (default strategy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from trainer.flags import parse_args
from trainer.loop.steps import train_calls
from trainer.models import create_task
from trainer.models.dae import corrupt


@pytest.mark.parametrize(
    ("name", "params"),
    [
        # conv 5x5x32, conv 5x5x64, dense 7*7*64 -> 1024, dense 1024 -> 10
        ("cnn", 832 + 51_264 + 3_212_288 + 10_250),
        # conv 5x5x64, 3x3x256, 3x3x512, dense 7*7*512 -> 2048, 2048 -> 1024, 1024 -> 10
        ("convnet", 1_664 + 147_712 + 1_180_160 + 51_382_272 + 2_098_176 + 10_250),
    ],
)
def test_classifiers_have_the_source_architectures(name: str, params: int) -> None:
    model = create_task(parse_args(["--model", name])).build_model()
    assert model.count_params() == params
    assert model(tf.zeros([3, 28, 28, 1])).shape == (3, 10)


@pytest.mark.parametrize("name", ["cnn", "convnet", "dae", "sdae"])
def test_a_checkpoint_holds_every_variable_of_the_model(name: str, tmp_path: Path) -> None:
    model = create_task(parse_args(["--model", name])).build_model()
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    saved = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    in_model = sorted(tuple(shape) for key, shape in saved.items() if key.startswith("model/"))
    assert in_model == sorted(tuple(v.shape) for v in model.variables)


def test_sdae_creates_both_layers_up_front_with_a_wider_second_layer() -> None:
    task = create_task(parse_args(["--model", "sdae", "--hidden", "64", "--width-factor", "3"]))
    model = task.build_model()
    shapes = {v.path: tuple(v.shape) for v in model.trainable_variables}
    assert shapes["sdae/encoder1/kernel"] == (64, 64)
    assert shapes["sdae/encoder2/kernel"] == (64, 192)
    assert shapes["sdae/decoder2/kernel"] == (192, 64)
    assert shapes["sdae/decoder1/kernel"] == (64, 64)
    phases = task.phases(model, 100)
    assert [(p.name, p.start, p.end, len(p.variables)) for p in phases] == [
        ("pretrain-layer-1", 0, 25, 4),
        ("pretrain-layer-2", 25, 50, 4),
        ("finetune", 50, 100, 8),
    ]


def test_noise_kinds() -> None:
    x = tf.fill([4, 1000], 0.5)
    seed = tf.constant([1, 2], tf.int64)
    masked = corrupt(x, "masking", 0.3, seed).numpy()
    assert set(np.unique(masked)) == {0.0, 0.5}
    assert abs((masked == 0).mean() - 0.3) < 0.03
    noisy = corrupt(x, "gaussian", 0.1, seed).numpy()
    assert noisy.min() >= 0.0 and noisy.max() <= 1.0 and abs(noisy.std() - 0.1) < 0.01
    np.testing.assert_array_equal(noisy, corrupt(x, "gaussian", 0.1, seed).numpy())  # stateless


@pytest.mark.parametrize("jit", [False, True], ids=["plain", "jit"])
def test_one_call_trains_the_phase_variables_only(jit: bool) -> None:
    """Greedy pretraining of layer 2 leaves layer 1 as it was; with --jit
    (XLA, traced without autograph) too."""
    import keras

    task = create_task(parse_args(["--model", "sdae", "--hidden", "16"]))
    model = task.build_model()
    phase = task.phases(model, 8)[1]  # pretrain-layer-2
    optimizer = keras.optimizers.Adam(1e-2)
    optimizer.build(list(phase.variables))
    step = tf.Variable(0, dtype=tf.int64)
    before = {v.path: v.numpy().copy() for v in model.variables}
    call = train_calls(tf.distribute.get_strategy(), phase, optimizer, model.variables, step,
                       jit=jit, claims=None)  # fmt: skip
    batch = {"clean": tf.random.uniform([4, 64]), "seed": tf.constant([3, 4], tf.int64)}
    batch["noisy"] = batch["clean"]
    iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
    loss_sum, sums, done = call(iterator, tf.constant(3, tf.int64), tf.constant(8, tf.int64))
    assert int(done) == 3 and int(step.numpy()) == 3 and int(optimizer.iterations.numpy()) == 3
    assert float(loss_sum) > 0 and set(sums) == {"mse"}
    changed = {v.path for v in model.variables if not np.array_equal(before[v.path], v.numpy())}
    assert changed == {v.path for v in phase.variables}


def test_steps_run_at_once_never_pass_the_limit_they_claim_against() -> None:
    """Async mode's guard (``claim_step``), with four callers at once and
    far more steps asked than the limit allows: exactly the limit's steps
    run. Checking the global step, then adding to it once applied, let
    concurrent workers both take the last step (121 of 120 in CI)."""
    import threading

    import keras

    task = create_task(parse_args(["--model", "sdae", "--hidden", "16"]))
    model = task.build_model()
    phase = task.phases(model, 1000)[1]
    optimizer = keras.optimizers.SGD(1e-3)
    optimizer.build(list(phase.variables))
    step = tf.Variable(0, dtype=tf.int64)
    claims = tf.Variable(0, dtype=tf.int64)
    call = train_calls(tf.distribute.get_strategy(), phase, optimizer, model.variables, step,
                       jit=False, claims=claims)  # fmt: skip
    batch = {"clean": tf.random.uniform([4, 64]), "seed": tf.constant([3, 4], tf.int64)}
    batch["noisy"] = batch["clean"]

    def run(limit: int, done: list[int]) -> None:
        iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
        asked, limited = tf.constant(40, tf.int64), tf.constant(limit, tf.int64)
        done.append(int(call(iterator, asked, limited)[2]))

    for limit in (40, 80, 120):  # three rounds, as the chief's: claims set to the step first
        claims.assign(step)
        done: list[int] = []
        threads = [threading.Thread(target=run, args=(limit, done)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert int(step.numpy()) == limit and sum(done) == 40, (limit, done)
