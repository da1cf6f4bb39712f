"""bench/gpu.py's child processes: each measures one thing in a TensorFlow
of its own (a fresh process, no memory held from the set-up before) and
prints its result as JSON on its last line.

Usage (bench/gpu.py runs it): ``python bench/support/gpu_children.py KIND SPEC``,
KIND one of probe, keras, eval and SPEC a JSON object.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer.data.mnist import load_split, resolve_data_dir  # noqa: E402
from trainer.distribution import accelerators  # noqa: E402
from trainer.models.classifier import ARCHITECTURES, ClassifierTask  # noqa: E402


def child_probe(_: dict[str, Any]) -> dict[str, Any]:
    gpus = tf.config.list_physical_devices("GPU")
    details = [
        tf.config.experimental.get_device_details(g).get("device_name", g.name) for g in gpus
    ]
    return {"gpus": details, "cuda": tf.test.is_built_with_cuda(), "tf": tf.__version__}


# -- Keras fit ---------------------------------------------------------------------


def keras_model(model: str, mixed: bool) -> Any:
    """The trainer's architecture as plain Keras layers."""
    keras.mixed_precision.set_global_policy("mixed_float16" if mixed else "float32")
    arch = ARCHITECTURES[model]
    layers: list[Any] = [keras.Input((28, 28, 1))]
    for filters, kernel, pool in arch.convs:
        layers.append(keras.layers.Conv2D(filters, kernel, padding="same", activation="relu"))
        if pool:
            layers.append(keras.layers.MaxPooling2D(2))
    layers.append(keras.layers.Flatten())
    for units in arch.dense:
        layers += [keras.layers.Dense(units, activation="relu"), keras.layers.Dropout(arch.dropout)]
    # float32 logits under mixed precision, as the trainer casts its own.
    layers.append(keras.layers.Dense(10, dtype="float32"))
    return keras.Sequential(layers)


def compiled_model(spec: dict[str, Any], strategy: Any) -> Any:
    """A fresh Keras model of the spec, seeded, compiled as the trainer trains."""
    keras.utils.set_random_seed(1)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras_model(spec["model"], spec["mixed"])
        model.compile(
            keras.optimizers.Adam(1e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=spec["xla"],
        )
    return model


def images(split: Any) -> Any:
    return split.images[..., None].astype(np.float32) / 255.0


class ToTarget(keras.callbacks.Callback):
    """Evaluates the test set after every epoch (``eval_every`` steps),
    outside the timed steps, and stops training at the target accuracy."""

    def __init__(self, predict: Any, test: Any, eval_every: int, target: float) -> None:
        super().__init__()
        self.predict = predict
        self.x_test, self.labels = images(test), test.labels
        self.eval_every, self.target = eval_every, target
        self.seconds, self.steps, self.accuracy = 0.0, 0, 0.0
        self.reached: dict[str, float] | None = None

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.began = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.seconds += time.perf_counter() - self.began  # evaluation not counted
        self.steps += self.eval_every
        x_test = self.x_test
        predicted = np.concatenate(
            [
                self.predict(x_test[i : i + 1000]).numpy().argmax(-1)
                for i in range(0, len(x_test), 1000)
            ]
        )
        hits = int((predicted == self.labels).sum())
        self.accuracy = hits / len(x_test)
        if self.accuracy >= self.target:
            self.reached = {"seconds": self.seconds, "steps": self.steps}
            self.model.stop_training = True


def child_keras(spec: dict[str, Any]) -> dict[str, Any]:
    """Throughput of Keras fit, then (with a target) a fresh model's
    training time to the target accuracy."""
    data_dir = resolve_data_dir(spec["data_dir"])
    train, test = load_split(data_dir, "train"), load_split(data_dir, "test")
    gpus = tf.config.list_logical_devices("GPU")
    strategy = tf.distribute.MirroredStrategy() if len(gpus) > 1 else None
    replicas = strategy.num_replicas_in_sync if strategy else 1
    batch = spec["batch_size"] * replicas
    data = (
        tf.data.Dataset.from_tensor_slices((images(train), train.labels.astype(np.int32)))
        .shuffle(len(train.labels), seed=1)
        .repeat()
        .batch(batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )

    model = compiled_model(spec, strategy)
    model.fit(data, steps_per_epoch=spec["warmup"], epochs=1, verbose=0)
    timed = spec["steps"] - spec["warmup"]
    start = time.perf_counter()
    model.fit(data, steps_per_epoch=timed, epochs=1, verbose=0)
    result: dict[str, Any] = {
        "examples_per_sec": timed * batch / (time.perf_counter() - start),
        "gpu_memory_peak_bytes": accelerators.memory_peaks(),
    }
    if spec.get("target"):
        del model
        model = compiled_model(spec, strategy)
        predict = tf.function(lambda batch: model(batch, training=False))
        callback = ToTarget(predict, test, spec["eval_every"], spec["target"])
        model.fit(
            data,
            steps_per_epoch=spec["eval_every"],
            epochs=spec["max_steps"] // spec["eval_every"],
            callbacks=[callback],
            verbose=0,
        )
        result["to_target"] = callback.reached
        result["last_accuracy"] = callback.accuracy
    return result


# -- the trainer's checkpoints ------------------------------------------------------


def child_eval(spec: dict[str, Any]) -> dict[str, Any]:
    """Test accuracy of every checkpoint of a trainer run, by step."""
    test = load_split(resolve_data_dir(spec["data_dir"]), "test")
    task = ClassifierTask(spec["model"])
    model = task.build_model()
    checkpoint = tf.train.Checkpoint(model=model)
    accuracy = {}
    for path in tf.train.get_checkpoint_state(spec["checkpoints"]).all_model_checkpoint_paths:
        checkpoint.restore(path).expect_partial()
        step = int(path.rsplit("-", 1)[1])
        accuracy[step] = task.evaluate(model, test, 1).results["test_accuracy"]
    return {"accuracy": accuracy}


CHILDREN = {"probe": child_probe, "keras": child_keras, "eval": child_eval}


if __name__ == "__main__":
    kind, spec = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(CHILDREN[kind](spec)))
