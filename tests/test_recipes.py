"""docs/architecture.md's recipes "add a model" and "add a training mode",
followed to the letter in a copy of this checkout, then run through
deploy.py on the local cluster (real TensorFlow processes).

A user's model or mode lives in their checkout: the nodes run ``python -m
trainer`` from the code the cluster syncs (the local provider: the
checkout itself), which is ``trainer/`` and nothing else of the user's, so
a catalog entry registered in some other process would never reach them.
The recipe's two files are therefore the whole mechanism, and each test
edits them as a user would: a module written into ``trainer/models/`` or
``trainer/modes/``, and the recipe's own catalog entry (the text of the
doc's code block, checked to be there) put into ``trainer/catalog.py``'s
``_MODELS`` or ``_MODES``. The copy leaves the checkout under test alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
# What deploy.py and the local nodes run of a checkout.
CHECKOUT = ("deploy.py", "pyproject.toml", "infra", "trainer", "tfcluster_cli")

pytestmark = pytest.mark.slow

# -- the recipe "add a model": trainer/models/mlp.py and its catalog entry -------

MLP_ENTRY = """\
Model("mlp", module="trainer.models.mlp", learning_rate=1e-3, classifier=True,
      final_metric=_ACCURACY,
      options=(Option("mlp-hidden", positive_int, 128, "mlp: hidden units"),)),
"""

MLP_MODULE = '''\
"""--model mlp: one hidden layer of --mlp-hidden units."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.data.mnist import Split, read_split_tf
from trainer.flags import Config
from trainer.data.inputs import index_batches
from trainer.models.base import Batch, Evaluation, Phase


class MlpTask:
    name = "mlp"

    def __init__(self, hidden: int) -> None:
        self.hidden = hidden

    def build_model(self) -> keras.Model:
        model = keras.Sequential([
            keras.layers.Flatten(),
            keras.layers.Dense(self.hidden, activation="relu"),
            keras.layers.Dense(10),
        ])
        model(tf.zeros([1, 28, 28, 1]))  # every variable now, in the caller's scope
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
        return {"hidden": self.hidden}


def create_task(config: Config) -> MlpTask:
    return MlpTask(hidden=config.options["mlp_hidden"])
'''

# -- the recipe "add a training mode": trainer/modes/every_k.py and its entry ----

EVERY_K_ENTRY = """\
Mode("every_k", task_types=("chief", "worker"), summary="summary line",
     module="trainer.modes.every_k", flag_help="help", strategy=COLLECTIVE),
"""

EVERY_K_MODULE = '''\
"""--mode every_k: sync training that counts its calls, each process
saying which task its TF_CONFIG made it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from trainer.modes.base import CollectiveMode


class EveryKMode(CollectiveMode):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        config = json.loads(os.environ["TF_CONFIG"])
        task = config["task"]
        tasks = sum(len(addresses) for addresses in config["cluster"].values())
        print(f"every_k: TF_CONFIG task {task['type']}-{task['index']} of {tasks}", flush=True)
        self.calls_done = 0

    def after_call(self) -> Callable[[int, bool], None] | None:
        def count(step: int, phase_end: bool) -> None:
            self.calls_done += 1

        return count

    def summary(self) -> dict[str, Any]:
        return {"every_k_calls": self.calls_done}


MODE = EveryKMode
'''


def user_checkout(root: Path) -> Path:
    """A copy of this checkout's code, as a user's clone would have it."""
    root.mkdir()
    for name in CHECKOUT:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, root / name)
    return root


def add_to_catalog(checkout: Path, entries: str, entry: str) -> None:
    """The recipe's step 2: ``entry`` as the first item of ``_MODELS`` or
    ``_MODES`` in trainer/catalog.py; the entry is the doc's own text."""
    assert entry in DOC.read_text(), f"docs/architecture.md no longer shows:\n{entry}"
    catalog = checkout / "trainer" / "catalog.py"
    text = catalog.read_text()
    opening = f"\n{entries} = (\n"
    assert text.count(opening) == 1, f"trainer/catalog.py has no single {entries.strip()}"
    catalog.write_text(text.replace(opening, opening + textwrap.indent(entry, "    "), 1))


def local_cluster(checkout: Path, roles: dict[str, object]) -> Path:
    """cluster.yaml of a local cluster with one node per task."""
    nodes = sorted({node for node in roles.values() if isinstance(node, str)})
    config = checkout / "cluster.yaml"
    config.write_text(yaml.safe_dump({
        "name": "recipe", "provider": "local", "nodes": nodes, "roles": roles,
    }))  # fmt: skip
    return config


def deploy(checkout: Path, *args: str) -> str:
    """``python deploy.py ARGS`` in the user's checkout: its trainer/ is the
    one the local nodes run."""
    done = subprocess.run(
        [sys.executable, "deploy.py", "--config", "cluster.yaml", *args],
        cwd=checkout, env=dict(os.environ, PYTHONPATH=str(checkout), COLUMNS="250"),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"deploy.py {' '.join(args)}: exit {done.returncode}\n{output}"
    return output


def test_a_new_model_trains_through_deploy_and_is_reported(tmp_path: Path, mnist_dir: Path) -> None:
    checkout = user_checkout(tmp_path / "checkout")
    (checkout / "trainer" / "models" / "mlp.py").write_text(MLP_MODULE)
    add_to_catalog(checkout, "_MODELS", MLP_ENTRY)
    local_cluster(checkout, {"ps": [], "chief": "pc-1", "worker": []})

    dest = tmp_path / "runs"
    deploy(
        checkout, "train", "--model", "mlp", "--mode", "single", "--steps", "40",
        "--batch-size", "64", "--data-dir", str(mnist_dir), "--dest", str(dest),
        "--", "--mlp-hidden", "32", "--log-every", "20", "--checkpoint-every", "0",
    )  # fmt: skip
    (run,) = dest.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["model"], summary["steps"]) == ("mlp", 40)
    assert summary["model_settings"] == {"hidden": 32}  # its own option reached the node
    assert summary["learning_rate"] == 1e-3  # the entry's default
    assert summary["test_accuracy"] > 0.5  # 40 steps of an MLP learn most digits

    out = deploy(checkout, "report", str(run))
    (row,) = [line for line in out.splitlines() if line.startswith(f"│ {run.name} ")]
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[1:3] == ["mlp", "single"], row
    # The entry's final_metric (_ACCURACY): summary.json's key and the chief's figure.
    assert cells[-1] == f"test_accuracy {summary['test_accuracy']:.4f}", row
    assert (run / "report.png").is_file()


def test_a_new_mode_runs_its_tasks_with_tf_config(tmp_path: Path, mnist_dir: Path) -> None:
    checkout = user_checkout(tmp_path / "checkout")
    (checkout / "trainer" / "modes" / "every_k.py").write_text(EVERY_K_MODULE)
    add_to_catalog(checkout, "_MODES", EVERY_K_ENTRY)
    local_cluster(checkout, {"ps": [], "chief": "pc-1", "worker": "pc-2"})

    dest = tmp_path / "runs"
    out = deploy(
        checkout, "train", "--model", "cnn", "--mode", "every_k", "--steps", "20",
        "--batch-size", "32", "--data-dir", str(mnist_dir), "--dest", str(dest),
        "--", "--steps-per-call", "5", "--log-every", "10", "--checkpoint-every", "0",
        "--no-eval",
    )  # fmt: skip
    assert "results: " in out
    (run,) = dest.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["mode"], summary["steps"], summary["workers"]) == ("every_k", 20, 2)
    # The first call is one step alone, then calls of 5 ending on every 10th.
    assert summary["every_k_calls"] == 1 + 4

    # Each task printed the task its own TF_CONFIG named, in a job of two.
    logs = deploy(checkout, "logs", "-n", "400")
    seen = sorted(line for line in logs.splitlines() if "every_k: TF_CONFIG" in line)
    assert seen == [
        "pc-1/chief-0 every_k: TF_CONFIG task chief-0 of 2",
        "pc-2/worker-0 every_k: TF_CONFIG task worker-0 of 2",
    ], logs
