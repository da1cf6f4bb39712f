"""The trainer's GPU options, on the CPU: the flags, the refusal to train
on the CPU when a GPU was required, mixed precision with loss scaling (one
replica and two), and bench/gpu.py's smoke run. What needs a GPU itself
(throughput, memory, utilisation) is bench/gpu.py's, on a GPU machine."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infra.jobs.tf_noise import is_tf_noise
from tests.trainer.cluster import REPO, task_env
from trainer.flags import REQUIRE_GPU_ENV, parse_args


def test_gpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE_GPU_ENV, raising=False)
    config = parse_args([])
    assert not (config.mixed_precision or config.jit or config.require_gpu)
    config = parse_args(["--mixed-precision", "--xla", "--require-gpu", "--mode", "sync"])
    assert config.mixed_precision and config.jit and config.require_gpu
    assert parse_args(["--jit"]).jit and not parse_args(["--xla", "--no-xla"]).jit
    assert parse_args(["--model", "convnet", "--mixed-precision"]).mixed_precision
    monkeypatch.setenv(REQUIRE_GPU_ENV, "1")
    assert parse_args([]).require_gpu
    monkeypatch.setenv(REQUIRE_GPU_ENV, "0")
    assert not parse_args([]).require_gpu


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "dae", "--mixed-precision"],
        ["--mode", "async", "--mixed-precision"],
        ["--keep-checkpoints", "-1"],
    ],
)
def test_gpu_flags_that_do_not_fit_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2


def trainer_lines(stderr: str) -> list[str]:
    """The trainer's own lines of ``stderr``: TensorFlow's load-time log
    (infra/jobs/tf_noise.py, tested on its recorded lines) left out."""
    return [x for x in stderr.strip().splitlines() if not is_tf_noise(x)]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_job_that_requires_a_gpu_refuses_to_train_on_the_cpu(how: str, tmp_path: Path) -> None:
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this holds on a GPU machine too.
    env = task_env({"CUDA_VISIBLE_DEVICES": "", "MNIST_DIR": str(tmp_path / "no-mnist")})
    env.pop("TF_CONFIG", None)
    argv = [sys.executable, "-m", "trainer", "--output-dir", str(tmp_path / "run")]
    if how == "flag":
        argv.append("--require-gpu")
    else:
        env[REQUIRE_GPU_ENV] = "1"
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 7  # not 4: refused before looking for the data
    (line,) = trainer_lines(result.stderr)
    assert line.startswith("trainer: error: this job must run on a GPU and TensorFlow sees none; ")
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_mixed_precision_cnn_learns_in_single_mode(tmp_path: Path, mnist_dir: Path) -> None:
    output = tmp_path / "run"
    result = subprocess.run(
        # float16 convolutions on a CPU are emulated and slow (30 steps of 32
        # took 5-10 min of CI): 15 steps of 16 show the loss going down.
        [sys.executable, "-m", "trainer", "--mixed-precision", "--steps", "15",
         "--batch-size", "16", "--log-every", "5", "--checkpoint-every", "0", "--no-eval",
         "--output-dir", str(output)],
        cwd=REPO, env=task_env({"MNIST_DIR": str(mnist_dir)}),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["mixed_precision"] and summary["optimizer_iterations"] == {"train": 15}
    losses = [json.loads(line)["loss"] for line in (output / "metrics.jsonl").open()]
    assert len(losses) == 3 and losses[-1] < losses[0] < 2.4  # ln 10: guessing
    # The loss was scaled: the optimizer's dynamic scale is in the checkpoint.
    import tensorflow as tf

    saved = tf.train.load_checkpoint(str(output / "checkpoints"))
    assert any("dynamic_scale" in key for key in saved.get_variable_to_shape_map())


# Two replicas of MirroredStrategy on two logical CPUs; replica 0's batch is
# finite, replica 1's holds an inf: neither may apply its update.
TWO_REPLICAS = textwrap.dedent(
    """
    import json
    import keras, numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from trainer.models.base import Phase
    from trainer.loop.steps import train_calls

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        step = tf.Variable(0, dtype=tf.int64, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

        def loss(batch):
            return tf.reduce_sum(model(batch["x"]) ** 2, axis=-1), {}

        phase = Phase("train", 0, 10, model.trainable_variables, loss, ())
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.1))
        optimizer.build(model.trainable_variables)
    before = [v.numpy().copy() for v in model.variables]
    x = np.ones([2, 3, 4], np.float32)
    x[1, 0, 0] = np.inf
    data = strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.from_tensor_slices({"x": x}).repeat()
    )
    call = train_calls(strategy, phase, optimizer, model.variables, step, jit=False, claims=None)
    call(iter(data), tf.constant(1, tf.int64), tf.constant(10, tf.int64))
    replicas = [[r.numpy() for r in strategy.experimental_local_results(v)] for v in model.variables]
    print(json.dumps({
        "unchanged": all(np.array_equal(r, b) for rs, b in zip(replicas, before) for r in rs),
        "scale": float(optimizer.dynamic_scale.numpy()),
    }))
    """
)


def test_loss_scaling_replicas_skip_a_step_together() -> None:
    result = subprocess.run(
        [sys.executable, "-c", TWO_REPLICAS],
        cwd=REPO,
        env=task_env({"CUDA_VISIBLE_DEVICES": ""}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome == {"unchanged": True, "scale": 2.0**14}


@pytest.mark.slow
def test_gpu_bench_cpu_smoke_runs_end_to_end(mnist_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu.py"), "--cpu-smoke", "--json-only"],
        env=task_env({"MNIST_DIR": str(mnist_dir)}),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    rows = {row["setup"]: row for row in report["results"]}
    assert set(rows) == {"keras_fit", "trainer_single", "trainer_sync"}
    assert all(row["examples_per_sec"] > 0 for row in rows.values())
    assert rows["trainer_sync"]["devices"] == ["/job:chief/replica:0/task:0/device:CPU:0"]
    assert 0 <= rows["trainer_single"]["last_accuracy"] <= 1
    assert report["goals"] is None  # a smoke run checks no goal
