"""``--mode layers``: the model split over worker tasks, each block of
consecutive layers on its own task (or local device).

The split and its refusals are plain Python, checked by the launcher before
any task starts, so most tests here need no TensorFlow process. The slow
ones train for real: a cnn over 2 workers of the local cluster (with and
without micro-batches), a worker killed mid-job and the job resumed, and a
checkpoint restored into another number of stages."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from deploy import cli
from infra.cluster.api import Cluster
from infra.config.loader import default_config, load_config
from infra.reports.placement import pipeline_text, placement_rows
from tests.procs import none_left_in, processes_in
from tests.trainer.cluster import REPO, read_summary, task_env
from tests.trainer.conftest import StartJob
from trainer import catalog
from trainer.layers import stages
from trainer.options import values_from_argv

CNN = catalog.model("cnn").layers(catalog.option_defaults())  # type: ignore[misc]
TWO_WORKERS = stages.slots_for("tasks", 2)


def split(model: str, workers: int, **flags: Any) -> list[tuple[int, tuple[str, ...]]]:
    layers = catalog.model(model).layers(catalog.option_defaults())  # type: ignore[misc]
    slots = stages.slots_for("tasks", workers)
    found = stages.plan(model, layers, slots, stages=flags.get("stages"), placement=flags.get("placement"))
    return [(s.slot, s.layers) for s in found.stages]


def test_the_default_split_gives_each_worker_about_the_same_parameter_bytes() -> None:
    # cnn: the convolutions (0.2 MB) against the dense layers (12.9 MB) is
    # the split whose largest stage is smallest; pooling, flatten and
    # dropout stay with the layer before them.
    assert split("cnn", 2) == [
        (0, ("conv2d", "max_pooling2d", "conv2d_1", "max_pooling2d_1", "flatten")),
        (1, ("dense", "dropout", "dense_1")),
    ]
    assert split("sdae", 2) == [(0, ("encoder1", "encoder2")), (1, ("decoder2", "decoder1"))]
    assert [slot for slot, _ in split("convnet", 3)] == [0, 1, 2]
    assert split("cnn", 2, placement="conv:1,dense:0")[0] == (1, split("cnn", 2)[0][1])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"placement": "conv:0,dense:0"}, "the split leaves worker 1 empty"),
        ({"placement": "conv:0,dense:2"}, "worker 2 does not exist: the job has 2 worker(s)"),
        ({"placement": "conv:0,attention:1"}, "no layer of cnn starts with 'attention'"),
        ({"placement": "conv"}, "'conv' is not PREFIX:TASK"),
        ({"placement": "conv2d:0,dense:1,dense_1:0"}, "worker 0 would hold two separate blocks"),
        ({"stages": 1}, "the split leaves worker 1 empty"),
        ({"stages": 3}, "worker 2 does not exist"),
        ({"stages": 2, "placement": "conv:0,dense:1"}, "--stages and --placement"),
    ],
)
def test_a_bad_split_is_refused_naming_the_bad_part(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        split("cnn", 2, **flags)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_the_mode_options_are_read_from_trainer_flags_as_the_trainer_reads_them() -> None:
    values = values_from_argv(
        catalog.options(),
        ["--seed", "3", "--placement=conv:0,dense:1", "--micro-batches", "4", "--no-overlap"],
    )
    assert values["placement"] == "conv:0,dense:1" and values["micro_batches"] == 4
    assert values["stages"] is None and values["devices"] == "tasks"
    with pytest.raises(ValueError, match="--micro-batches 0: must be at least 1"):
        values_from_argv(catalog.options(), ["--micro-batches", "0"])
    with pytest.raises(ValueError, match="--devices tpu: choose one of tasks, gpu, cpu"):
        values_from_argv(catalog.options(), ["--devices", "tpu"])


def test_the_launch_says_how_it_splits_and_that_the_ps_is_not_used() -> None:
    spec = Cluster(default_config()).train_spec(mode="layers", model="cnn")
    assert spec.program.task_types == ("chief", "worker")  # no ps task starts
    split_line, ps_line = spec.notes
    assert split_line == (
        "layers: 2 stage(s), one per worker, cut where the largest holds the fewest bytes: "
        "worker 0 holds conv2d..flatten (0.21 MB); worker 1 holds dense..dense_1 (12.89 MB)"
    )
    assert ps_line.startswith("layers does not use the ps (pc-1): no ps task starts")
    on_gpus = Cluster(default_config()).train_spec(
        mode="layers", model="cnn", extra_args=("--devices", "gpu")
    )
    assert on_gpus.notes[0] == (
        "layers --devices gpu: the stages go to the chief's own devices; the workers "
        "(pc-2, pc-3) start but hold nothing"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--", "--placement", "conv:0,linear:1"], "no layer of cnn starts with 'linear'"),
        (["--", "--stages", "1"], "the split leaves worker 1 empty"),
        (["--batch-size", "30", "--", "--micro-batches", "4"], "--micro-batches 4 does not divide"),
    ],
)
def test_a_bad_split_is_exit_2_with_one_line_before_any_task_starts(
    args: list[str], message: str, tfcluster_home: Path
) -> None:
    result = CliRunner().invoke(cli, ["train", "--mode", "layers", "--model", "cnn", *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("error: --mode layers")
    assert Cluster(default_config()).last_job() is None
    assert processes_in(tfcluster_home) == []


def test_the_model_layer_lists_are_the_built_models_layers() -> None:
    """trainer/layers/architectures.py (plain Python, read by the launcher) says
    what the Keras models are: their layers' names, call order and sizes."""
    from trainer.flags import parse_args
    from trainer.models import create_task
    from trainer.modes import placement

    class Calls:
        def __init__(self) -> None:
            self.order: list[int] = []

        def enter(self, stage: int, args: tuple[Any, ...]) -> tuple[Any, ...]:
            self.order.append(stage)
            return args

        def leave(self, stage: int, outputs: Any) -> None:
            pass

    for model in catalog.MODELS:
        config = parse_args(["--model", model])
        task = create_task(config)
        built = task.build_model()
        listed = catalog.model(model).layers(config.options)  # type: ignore[misc]
        assert [(x.name, x.count_params()) for x in built.layers] == [
            (x.name, x.params) for x in listed
        ], model
        for i, layer in enumerate(built.layers):
            placement.place(layer, i, "/device:CPU:0")
        with placement.recording(Calls()) as calls:
            built(task.example_input())  # type: ignore[attr-defined]
        assert calls.order == list(range(len(listed))), model  # type: ignore[attr-defined]


def test_a_stage_is_busy_while_any_piece_is_in_it_and_waits_the_rest_of_the_step() -> None:
    import numpy as np

    from trainer.modes.pipeline import StageTiming

    timing = StageTiming(2)
    # Stage 0: two pieces forward (overlapping: 0-2), then backward (3-4.5);
    # stage 1 saw no piece (zeros); stamps are [f_start, f_end, b_start, b_end].
    stamps = np.array([
        [[10.0, 11.0, 13.0, 14.0], [10.5, 12.0, 13.5, 14.5]],
        [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]],
    ])  # fmt: skip
    timing.add(stamps, wall=5.0)
    found = timing.summary()
    assert found["stage_seconds"] == [3.5, 0.0]
    assert found["bubble_per_stage"] == [0.3, 1.0] and found["bubble"] == 0.65


def test_the_ops_a_gpu_cannot_run_are_listed() -> None:
    import tensorflow as tf

    from trainer.modes.placement import cpu_fallbacks

    graph = tf.Graph()
    with graph.as_default():
        with tf.device("/device:GPU:0"):
            tf.strings.as_string(tf.constant(1.0) + 1.0)
        with tf.device("/device:CPU:0"):
            tf.strings.as_string(tf.constant(2.0))
    on_gpu = {"AddV2", "Const"}
    assert cpu_fallbacks([graph], lambda op: op in on_gpu) == ["AsString"]


def test_report_shows_the_placement_from_summary_json(tmp_path: Path) -> None:
    summary = {
        "model": "cnn", "mode": "layers", "workers": 2, "steps": 10, "training_seconds": 1.0,
        "examples_per_sec": 5.0, "stages": [{}, {}], "micro_batches": 4, "bubble": 0.25,
        "gpipe_bubble": 0.2, "stage_seconds": [1.5, 2],
        "placement": {"conv2d/kernel": "/job:worker/replica:0/task:0/device:CPU:0",
                      "dense/kernel": "/job:worker/replica:0/task:1/device:CPU:0", "x": 3},
        "params_per_device": {"/job:worker/replica:0/task:0/device:CPU:0": 3_200_000},
    }  # fmt: skip
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(summary))
    rows = placement_rows(summary)
    assert [(r.device[-19:], r.variables, r.bytes) for r in rows] == [
        ("task:0/device:CPU:0", ("conv2d/kernel",), 3_200_000),
        ("task:1/device:CPU:0", ("dense/kernel",), None),
    ]
    assert pipeline_text(summary) == (
        "2 stages, 4 micro-batch(es): stages waited 25% of each step (GPipe's bubble for equal "
        "stages: 20%); compute seconds per stage: 1.5, 2.0"
    )
    result = CliRunner().invoke(cli, ["report", str(run), "--plot", str(tmp_path / "p.png")])
    assert result.exit_code == 0, result.output
    assert "run: where the variables live" in result.output and "conv2d/kernel" in result.output


# -- real training ----------------------------------------------------------------------


def _two_workers(tmp_path: Path, mnist_dir: Path) -> Cluster:
    """A local cluster of a chief and two workers, and no ps."""
    config = {
        "name": "layers",
        "provider": "local",
        "nodes": ["pc-1", "pc-2", "pc-3"],
        "roles": {"chief": "pc-1", "worker": ["pc-2", "pc-3"]},
        "job": {"data_dir": str(mnist_dir)},
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    return Cluster(load_config(path))


@pytest.mark.slow
@pytest.mark.parametrize("pieces", [1, 4])
def test_a_cnn_over_two_workers_puts_convolutions_and_dense_layers_apart_and_learns(
    pieces: int, tmp_path: Path, tfcluster_home: Path, mnist_dir: Path
) -> None:
    cluster = _two_workers(tmp_path, mnist_dir)
    result = cluster.train(
        model="cnn", mode="layers", steps=300, batch_size=64, checkpoint_every=300,
        extra_args=("--micro-batches", str(pieces)), dest=tmp_path / "run",
    )  # fmt: skip
    result.check()
    summary = read_summary(result.destination)
    placement = summary["placement"]  # read from the variables themselves
    assert {d for p, d in placement.items() if p.startswith("conv2d")} == {
        "/job:worker/replica:0/task:0/device:CPU:0"
    }
    assert {d for p, d in placement.items() if p.startswith("dense")} == {
        "/job:worker/replica:0/task:1/device:CPU:0"
    }
    assert len(placement) == 8 and summary["mode"] == "layers" and summary["ps"] == 0
    assert summary["test_accuracy"] >= 0.95, summary["test_accuracy"]
    assert summary["micro_batches"] == pieces and 0 <= summary["bubble"] < 1
    assert summary["measured_steps"] == 299 and len(summary["stage_seconds"]) == 2
    none_left_in(tfcluster_home)


def _error_line(log: str) -> str:
    return [line for line in log.splitlines() if line.startswith("trainer: error:")][-1]


@pytest.mark.slow
def test_a_killed_worker_ends_the_job_with_one_line_and_resume_goes_on(
    start_job: StartJob, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    argv = ["--model", "cnn", "--steps", "100", "--batch-size", "32", "--checkpoint-every", "20",
            "--output-dir", str(out)]  # fmt: skip
    job = start_job("layers", argv, workers=2)
    deadline = time.monotonic() + 600
    while '"event":"checkpoint"' not in job.log() and time.monotonic() < deadline:
        assert job.processes["chief-0"].poll() is None, job.logs()
        time.sleep(0.2)
    job.kill("worker-1")
    assert job.wait(120) == 3  # ClusterError, without waiting for anything
    line = _error_line(job.log())
    assert line.startswith("trainer: error: lost worker 1 (localhost:")
    assert "which held stage 2 of 2 (dense..dense_1): `--resume` goes on from the last" in line
    checkpoint = int(line.rsplit("(step ", 1)[1].rstrip(")"))
    job.stop()

    again = start_job("layers", [*argv, "--resume"], workers=2, name="resumed")
    assert again.wait(600) == 0, again.logs()
    summary = read_summary(out)
    assert summary["resumed_from_step"] == checkpoint >= 20 and summary["steps"] == 100


@pytest.mark.slow
def test_a_checkpoint_restores_into_another_number_of_stages(tmp_path: Path, mnist_dir: Path) -> None:
    """One process, its CPU split into one logical device per stage
    (--devices cpu): 2 stages, then --resume with 3; and the trainer's own
    refusal of a bad split, for a job started without the launcher."""
    out = tmp_path / "run"
    base = ["--mode", "layers", "--devices", "cpu", "--model", "cnn", "--batch-size", "32",
            "--checkpoint-every", "10", "--output-dir", str(out), "--no-eval"]  # fmt: skip
    first = _trainer(mnist_dir, *base, "--steps", "10")
    assert first.returncode == 0, first.stdout[-2000:]
    assert len(read_summary(out)["params_per_device"]) == 2
    second = _trainer(mnist_dir, *base, "--steps", "20", "--stages", "3", "--resume")
    assert second.returncode == 0, second.stdout[-2000:]
    summary = read_summary(out)
    assert summary["resumed_from_step"] == 10 and summary["steps"] == 20
    assert sorted(summary["params_per_device"].values()) == [41_000, 208_384, 12_849_152]
    bad = _trainer(mnist_dir, *base, "--steps", "20", "--placement", "conv:0,nope:1")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == (
        "trainer: error: --placement: no layer of cnn starts with 'nope'; its layers: conv2d, "
        "max_pooling2d, conv2d_1, max_pooling2d_1, flatten, dense, dropout, dense_1"
    )


def _trainer(mnist_dir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = task_env({"MNIST_DIR": str(mnist_dir)})
    return subprocess.run(
        [sys.executable, "-m", "trainer", *argv], cwd=REPO, env=env, capture_output=True, text=True
    )
