"""The recipe for a new model and a new mode, followed from here: a toy
model (with a command-line option of its own) and a toy mode, registered in
the catalog by this test alone (their implementations are in this file),
train in-process through the trainer's own flags and ``run`` and leave a run
folder like any other run's."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from infra.jobs.progress import parse_line
from trainer import catalog
from trainer.data.inputs import index_batches
from trainer.data.mnist import Split
from trainer.flags import Config, parse_args
from trainer.loop.progress import Progress
from trainer.models.base import Batch, Evaluation, Phase
from trainer.modes.base import TrainingMode
from trainer.options import Option, non_negative_int

# -- the model: this module's create_task, named by its catalog entry ----------


class ToyTask:
    """A classifier of MNIST digits: linear, or with one hidden layer of
    ``--toy-hidden`` units (its own option)."""

    name = "toy"

    def __init__(self, config: Config) -> None:
        self.hidden: int = config.options["toy_hidden"]
        self.dense_layers = 0

    def build_model(self) -> keras.Model:
        hidden = [keras.layers.Dense(self.hidden, activation="relu")] if self.hidden else []
        model = keras.Sequential([keras.layers.Flatten(), *hidden, keras.layers.Dense(10)])
        model(tf.zeros([1, 28, 28, 1]))  # every variable now, in the caller's scope
        self.dense_layers = sum(isinstance(x, keras.layers.Dense) for x in model.layers)
        return model

    def phases(self, model: keras.Model, total_steps: int) -> list[Phase]:
        def loss(batch: Batch) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
            logits = model(batch["x"], training=True)
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(batch["y"], logits)
            correct = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), batch["y"])
            return per_example, {"accuracy": tf.reduce_mean(tf.cast(correct, tf.float32))}

        return [Phase("train", 0, total_steps, model.trainable_variables, loss, ("accuracy",))]

    def train_examples(self, num_images: int) -> int:
        return num_images

    def build_inputs(
        self, data_dir: str, batch_size: int, start_batch: int, key: tf.Tensor
    ) -> tf.data.Dataset:
        from trainer.data.mnist import read_split_tf

        images, labels = read_split_tf(data_dir, "train")

        def cut(item: dict[str, tf.Tensor]) -> Batch:
            x = tf.cast(tf.gather(images, item["index"]), tf.float32) / 255.0
            return {"x": x[..., None], "y": tf.gather(labels, item["index"])}

        return index_batches(tf.shape(labels)[0], batch_size, start_batch, key).map(cut)

    def evaluate(self, model: keras.Model, test: Split, seed: int) -> Evaluation:
        x = test.images[..., None].astype(np.float32) / 255.0
        predicted = model(tf.constant(x)).numpy().argmax(axis=-1)
        return Evaluation(results={"test_accuracy": float((predicted == test.labels).mean())})

    def describe(self) -> dict[str, Any]:
        return {"layers": self.dense_layers, "hidden": self.hidden}


def create_task(config: Config) -> ToyTask:
    return ToyTask(config)


# -- the mode: this module's MODE, named by its catalog entry ------------------


class ToyMode(TrainingMode):
    """Single mode, counting the calls of the loop (a stand-in for what a
    real mode does between calls: average mode averages there)."""

    def after_call(self) -> Callable[[int, bool], None] | None:
        self.calls_seen: list[int] = []
        return lambda step, phase_end: self.calls_seen.append(step)

    def summary(self) -> dict[str, Any]:
        return {"toy_calls": len(self.calls_seen)}


MODE = ToyMode


# -- the registration: each one entry in trainer/catalog.py --------------------

TOY_MODEL = catalog.Model(
    "toy",
    __name__,
    1e-2,
    classifier=True,
    final_metric=("accuracy", "test_accuracy", "accuracy"),
    options=(Option("toy-hidden", non_negative_int, 0, "toy: hidden units (0: linear)"),),
)
TOY_MODE = catalog.Mode(
    "toy", ("chief",), "one process, counting calls", __name__, "toy", catalog.LOCAL
)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(catalog.MODEL_SPECS, "toy", TOY_MODEL)
    monkeypatch.setitem(catalog.MODES, "toy", TOY_MODE)


def test_a_toy_model_trains_in_a_toy_mode(
    registered: None, tmp_path: Path, mnist_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.run import run

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TFCLUSTER_REQUIRE_GPU", raising=False)
    output = tmp_path / "run"
    argv = "--model toy --mode toy --steps 30 --batch-size 32 --checkpoint-every 10"
    argv += " --log-every 10 --steps-per-call 5 --toy-hidden 16"
    config = parse_args([*argv.split(), "--output-dir", str(output), "--data-dir", str(mnist_dir)])
    assert config.learning_rate == TOY_MODEL.learning_rate  # the model's default
    out = io.StringIO()
    run(config, Progress(out))

    summary = json.loads((output / "summary.json").read_text())
    assert (summary["model"], summary["mode"], summary["steps"]) == ("toy", "toy", 30)
    assert (summary["workers"], summary["ps"]) == (1, 0)
    # The first call is one step alone, then calls of 5 ending on every 10th.
    assert summary["toy_calls"] == 1 + 6
    assert summary["model_settings"] == {"layers": 2, "hidden": 16}  # its option, used
    assert summary["test_accuracy"] > 0.5  # a linear model learns some digits in 30 steps
    lines = [json.loads(x) for x in (output / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [10, 20, 30]
    assert (output / "loss.png").exists() and (output / "checkpoints" / "checkpoint").exists()
    events = [parse_line(line) for line in out.getvalue().splitlines()]
    assert [e.kind for e in events if e is not None][-1] == "done"


def test_a_toy_model_option_is_a_flag_of_the_trainer(
    registered: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse_args([]).options["toy_hidden"] == 0  # the declared default
    assert Config().options["toy_hidden"] == 0
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--model", "toy", "--toy-hidden", "-1"])
    assert exit_info.value.code == 2
    assert "argument --toy-hidden: must be 0 or more, got -1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert "toy: hidden units (0: linear)" in capsys.readouterr().out
