"""The trainer on this machine's GPUs against plain Keras ``fit``, in one run.

For the convnet and the CNN, with mixed precision and XLA each off and on,
one after the other on this machine:

* plain Keras ``fit`` of the same architecture (Keras' own Dropout, the
  same Adam, the same per-GPU batch; MirroredStrategy where there are
  several GPUs, so that it uses the devices the trainer uses);
* ``python -m trainer --mode single`` (MirroredStrategy over every local GPU);
* ``python -m trainer --mode sync`` (MultiWorkerMirroredStrategy): one task
  per GPU, each seeing only its own (``CUDA_VISIBLE_DEVICES``), as tasks on
  separate one-GPU nodes would; one task where there is one GPU.

Measured per set-up: steady examples/s (the first log interval, with the
tracing and compiling, left out, for Keras too), the peak GPU memory
TensorFlow's allocator held (``tf.config.experimental.get_memory_info``,
summed over the GPUs) and the mean GPU utilisation nvidia-smi reported while
it ran (sampled twice a second). For the CNN also the training time to
``--target`` (98.5 %) accuracy on the offline MNIST test set: Keras
evaluates after every ``--eval-every`` steps outside its timed steps and
stops at the target; the trainer keeps a checkpoint every ``--eval-every``
steps (their saving counts in its time), each evaluated after the run, and
its time is the run's elapsed training time at the first checkpoint that
reaches the target.

Every set-up runs in processes of its own (a fresh TensorFlow, no memory
held from the one before). Ratios are against Keras ``fit`` of the same
model and settings, measured in the same run. Goals on an H100 (issue 16):
the convnet in ``single`` at 20,000 examples/s or more, the CNN at 98.5 % in
under 20 s of training, the trainer within 5 % of Keras ``fit``.

Without a GPU it says so in one line and exits 0. ``--cpu-smoke`` runs a
tiny version on the CPU (the CNN, a few steps, a low target) to show that
every part of the script works; its figures mean nothing.

Usage: ``python bench/gpu.py [--models cnn,convnet] [--precision off,on]
[--xla off,on] [--steps N] [--json-only]`` (MNIST from --data-dir or
$MNIST_DIR, as for the trainer).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infra import commands, facts  # noqa: E402  (no TensorFlow: the parent stays light)

MODELS = ("convnet", "cnn")
# Per-GPU batches: the source material's convnet ran 1024 per GPU.
BATCH = {"convnet": 1024, "cnn": 256}
TARGET_MODEL = "cnn"
CHILD_TIMEOUT_S = 3600


@dataclass(frozen=True)
class Setting:
    model: str
    mixed: bool
    xla: bool

    @property
    def name(self) -> str:
        return f"{self.model} mp={'on' if self.mixed else 'off'} xla={'on' if self.xla else 'off'}"


@dataclass(frozen=True)
class Sizes:
    batch: dict[str, int]
    steps: int  # throughput runs
    warmup: int  # steps left out of throughput (and the trainer's first log interval)
    target: float
    eval_every: int
    max_steps: int  # time-to-accuracy runs give up here
    target_modes: tuple[str, ...] = ("single", "sync")  # trainer modes timed to the target


# -- child processes (each its own TensorFlow) ---------------------------------


def child_env(cpu: bool, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"})
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # --cpu-smoke stays on the CPU on a GPU machine too
    env.update(extra)
    return env


def run_child(kind: str, spec: dict[str, Any], cpu: bool) -> dict[str, Any]:
    """Run ``bench/gpu.py --child KIND`` and return the JSON of its last line."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--spec", json.dumps(spec)],
        env=child_env(cpu),
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{kind} child failed ({out.returncode}):\n{out.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def child_probe(_: dict[str, Any]) -> dict[str, Any]:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    details = [
        tf.config.experimental.get_device_details(g).get("device_name", g.name) for g in gpus
    ]
    return {"gpus": details, "cuda": tf.test.is_built_with_cuda(), "tf": tf.__version__}


def keras_model(model: str, mixed: bool) -> Any:
    """The trainer's architecture as plain Keras layers."""
    import keras

    from trainer.models.classifier import ARCHITECTURES

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


def child_keras(spec: dict[str, Any]) -> dict[str, Any]:
    """Throughput of Keras fit, then (with a target) a fresh model's
    training time to the target accuracy."""
    import contextlib

    import keras
    import numpy as np
    import tensorflow as tf

    from trainer import accelerators
    from trainer.data import load_split, resolve_data_dir

    data_dir = resolve_data_dir(spec["data_dir"])
    train, test = load_split(data_dir, "train"), load_split(data_dir, "test")
    x = train.images[..., None].astype(np.float32) / 255.0
    y = train.labels.astype(np.int32)
    x_test = test.images[..., None].astype(np.float32) / 255.0
    gpus = tf.config.list_logical_devices("GPU")
    strategy = tf.distribute.MirroredStrategy() if len(gpus) > 1 else None
    replicas = strategy.num_replicas_in_sync if strategy else 1
    batch = spec["batch_size"] * replicas
    data = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(y), seed=1)
        .repeat()
        .batch(batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )

    def compiled() -> Any:
        with strategy.scope() if strategy else contextlib.nullcontext():
            model = keras_model(spec["model"], spec["mixed"])
            model.compile(
                keras.optimizers.Adam(1e-3),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                jit_compile=spec["xla"],
            )
        return model

    keras.utils.set_random_seed(1)
    model = compiled()
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
        keras.utils.set_random_seed(1)
        model = compiled()
        predict = tf.function(lambda images: model(images, training=False))

        class ToTarget(keras.callbacks.Callback):
            def __init__(self) -> None:
                super().__init__()
                self.seconds, self.steps, self.accuracy = 0.0, 0, 0.0
                self.reached: dict[str, float] | None = None

            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                self.began = time.perf_counter()

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                self.seconds += time.perf_counter() - self.began  # evaluation not counted
                self.steps += spec["eval_every"]
                predicted = np.concatenate(
                    [
                        predict(x_test[i : i + 1000]).numpy().argmax(-1)
                        for i in range(0, len(x_test), 1000)
                    ]
                )
                hits = int((predicted == test.labels).sum())
                self.accuracy = hits / len(x_test)
                if self.accuracy >= spec["target"]:
                    self.reached = {"seconds": self.seconds, "steps": self.steps}
                    self.model.stop_training = True

        callback = ToTarget()
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


def child_eval(spec: dict[str, Any]) -> dict[str, Any]:
    """Test accuracy of every checkpoint of a trainer run, by step."""
    import tensorflow as tf

    from trainer.data import load_split, resolve_data_dir
    from trainer.models.classifier import ClassifierTask

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


# -- the trainer's jobs ------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def run_trainer(
    mode: str, setting: Setting, argv: list[str], output: Path, gpus: int, cpu: bool
) -> dict[str, Any]:
    """One job of real trainer processes; the chief's summary.json."""
    flags = [
        "--model", setting.model, "--mode", mode, "--output-dir", str(output), "--no-eval",
        *(["--mixed-precision"] if setting.mixed else []), *(["--xla"] if setting.xla else []),
        *([] if cpu else ["--require-gpu"]), *argv,
    ]  # fmt: skip
    tasks = max(1, gpus) if mode == "sync" else 1
    names = ["chief", *(["worker"] * (tasks - 1))]
    addresses = [f"localhost:{p}" for p in free_ports(tasks)]
    cluster = {"chief": addresses[:1], **({"worker": addresses[1:]} if tasks > 1 else {})}
    processes = []
    output.mkdir(parents=True, exist_ok=True)
    try:
        for i, kind in enumerate(names):
            extra = {}
            if mode == "sync":
                index = 0 if kind == "chief" else i - 1
                extra["TF_CONFIG"] = json.dumps(
                    {"cluster": cluster, "task": {"type": kind, "index": index}}
                )
                if tasks > 1:
                    extra["CUDA_VISIBLE_DEVICES"] = str(i)
            log = (output.parent / f"{output.name}-{kind}-{i}.log").open("w")
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "trainer", *flags],
                    cwd=REPO,
                    env=child_env(cpu, **extra),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        codes = [p.wait(timeout=CHILD_TIMEOUT_S) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        logs = (output.parent / f"{output.name}-chief-0.log").read_text()[-4000:]
        raise RuntimeError(f"trainer {mode} {setting.name} exited {codes}:\n{logs}")
    summary: dict[str, Any] = json.loads((output / "summary.json").read_text())
    return summary


def elapsed_by_step(output: Path) -> dict[int, float]:
    lines = (output / "metrics.jsonl").read_text().splitlines()
    return {int(x["step"]): float(x["elapsed"]) for x in map(json.loads, lines) if "elapsed" in x}


# -- GPU utilisation -------------------------------------------------------------


class Utilisation:
    """Mean utilisation over every GPU while a set-up runs, from nvidia-smi
    (``infra/commands.gpu_query``, the query ``deploy.py status`` uses)."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            out = subprocess.run(
                ["bash", "-c", commands.gpu_query()], capture_output=True, text=True, timeout=30
            )
            report = facts.parse_gpus(out.stdout)
            self.samples += [g.utilization for g in report.gpus if g.utilization is not None]

    def __enter__(self) -> Utilisation:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float | None:
        return statistics.mean(self.samples) if self.samples else None


# -- the benchmark ----------------------------------------------------------------


def gib(peaks: dict[str, int] | None) -> float | None:
    return sum(peaks.values()) / 2**30 if peaks else None


def bench(
    settings: list[Setting], sizes: Sizes, data_dir: str, gpus: int, cpu: bool, root: Path
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for setting in settings:
        batch = sizes.batch[setting.model]
        target = setting.model == TARGET_MODEL
        spec = {
            "model": setting.model, "mixed": setting.mixed, "xla": setting.xla,
            "batch_size": batch, "steps": sizes.steps, "warmup": sizes.warmup,
            "data_dir": data_dir, "eval_every": sizes.eval_every, "max_steps": sizes.max_steps,
            "target": sizes.target if target else None,
        }  # fmt: skip
        print(f"bench: {setting.name}: keras fit", file=sys.stderr, flush=True)
        with Utilisation() as util:
            keras = run_child("keras", spec, cpu)
        base = keras["examples_per_sec"]
        rows.append(
            {
                "setup": "keras_fit", **asdict(setting), "batch_per_gpu": batch,
                "examples_per_sec": base, "vs_keras_fit": 1.0,
                "gpu_memory_peak_gib": gib(keras["gpu_memory_peak_bytes"]),
                "gpu_utilisation": util.mean,
                "seconds_to_target": (keras.get("to_target") or {}).get("seconds"),
                "steps_to_target": (keras.get("to_target") or {}).get("steps"),
            }
        )  # fmt: skip
        for mode in ("single", "sync"):
            name = f"{setting.model}-{mode}-mp{int(setting.mixed)}-xla{int(setting.xla)}"
            print(f"bench: {setting.name}: trainer {mode}", file=sys.stderr, flush=True)
            with Utilisation() as util:
                summary = run_trainer(
                    mode, setting,
                    ["--steps", str(sizes.steps), "--batch-size", str(batch),
                     "--log-every", str(sizes.warmup), "--checkpoint-every", "0",
                     "--data-dir", data_dir],
                    root / name, gpus, cpu,
                )  # fmt: skip
            row = {
                "setup": f"trainer_{mode}", **asdict(setting), "batch_per_gpu": batch,
                "examples_per_sec": summary["steady_examples_per_sec"],
                "vs_keras_fit": summary["steady_examples_per_sec"] / base,
                "gpu_memory_peak_gib": gib(summary.get("gpu_memory_peak_bytes")),
                "gpu_utilisation": util.mean,
                "devices": summary.get("devices"),
                "seconds_to_target": None, "steps_to_target": None,
            }  # fmt: skip
            if target and mode in sizes.target_modes:
                print(f"bench: {setting.name}: trainer {mode} to target", file=sys.stderr)
                output = root / f"{name}-target"
                run_trainer(
                    mode, setting,
                    ["--steps", str(sizes.max_steps), "--batch-size", str(batch),
                     "--log-every", str(sizes.eval_every),
                     "--checkpoint-every", str(sizes.eval_every), "--keep-checkpoints", "0",
                     "--data-dir", data_dir],
                    output, gpus, cpu,
                )  # fmt: skip
                spec = {"model": setting.model, "data_dir": data_dir,
                        "checkpoints": str(output / "checkpoints")}  # fmt: skip
                accuracy = {int(k): v for k, v in run_child("eval", spec, cpu)["accuracy"].items()}
                elapsed = elapsed_by_step(output)
                reached = sorted(s for s, a in accuracy.items() if a >= sizes.target)
                if reached:
                    row["steps_to_target"] = reached[0]
                    row["seconds_to_target"] = elapsed[reached[0]]
                row["last_accuracy"] = accuracy[max(accuracy)]
            rows.append(row)
    return rows


def goals(rows: list[dict[str, Any]], target: float) -> dict[str, bool | None]:
    """Issue 16's goals (meant for an H100), from this run's rows."""

    def best(setup: str, model: str, key: str, pick: Any = max) -> Any:
        values = [r[key] for r in rows if r["setup"] == setup and r["model"] == model]
        values = [v for v in values if v is not None]
        return pick(values) if values else None

    convnet = best("trainer_single", "convnet", "examples_per_sec")
    to_target = best("trainer_single", "cnn", "seconds_to_target", min)
    ratios = [r["vs_keras_fit"] for r in rows if r["setup"] == "trainer_single"]
    return {
        "convnet single >= 20000 examples/s": None if convnet is None else convnet >= 20000,
        f"cnn {target:.1%} in < 20 s": None if to_target is None else to_target < 20,
        "trainer single >= 0.95x keras fit (every setting)": (
            min(ratios) >= 0.95 if ratios else None
        ),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    def fmt(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    print(
        f"{'set-up':<16}{'model':<9}{'mp':<4}{'xla':<5}{'examples/s':>11}{'vs fit':>8}"
        f"{'mem GiB':>9}{'util %':>8}{'to target s':>13}{'steps':>7}"
    )
    for r in rows:
        print(
            f"{r['setup']:<16}{r['model']:<9}{'on' if r['mixed'] else 'off':<4}"
            f"{'on' if r['xla'] else 'off':<5}{r['examples_per_sec']:>11.0f}"
            f"{r['vs_keras_fit']:>7.2f}x{fmt(r['gpu_memory_peak_gib'], '.2f'):>9}"
            f"{fmt(r['gpu_utilisation'], '.0f'):>8}{fmt(r['seconds_to_target'], '.1f'):>13}"
            f"{fmt(r['steps_to_target'], 'd'):>7}"
        )


def on_off(text: str) -> list[bool]:
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words or any(w not in ("off", "on") for w in words):
        raise argparse.ArgumentTypeError(f"expected off, on or off,on; got {text!r}")
    return [w == "on" for w in words]


def model_list(text: str) -> list[str]:
    names = [w.strip() for w in text.split(",") if w.strip()]
    if not names or any(n not in MODELS for n in names):
        raise argparse.ArgumentTypeError(f"expected models among {', '.join(MODELS)}; got {text!r}")
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=model_list, default=list(MODELS))
    parser.add_argument("--precision", type=on_off, default=[False, True], help="off,on")
    parser.add_argument("--xla", type=on_off, default=[False, True], help="off,on")
    parser.add_argument("--steps", type=int, default=300, help="steps of each throughput run")
    parser.add_argument("--warmup", type=int, default=50, help="steps left out of throughput")
    parser.add_argument("--target", type=float, default=0.985, help="CNN test accuracy")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--max-steps", type=int, default=3000, help="of time-to-target runs")
    parser.add_argument("--data-dir", default=os.environ.get("MNIST_DIR"))
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="a tiny run on the CPU that exercises every part (its figures mean nothing)",
    )
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(CHILDREN[args.child](json.loads(args.spec or "{}"))))
        return 0
    if args.cpu_smoke:
        settings = [Setting("cnn", mixed=False, xla=False)]
        sizes = Sizes({"cnn": 16, "convnet": 16}, steps=6, warmup=3, target=0.3,
                      eval_every=10, max_steps=20, target_modes=("single",))  # fmt: skip
        gpus, device = 0, "CPU (smoke run: figures mean nothing)"
    else:
        if args.steps <= 2 * args.warmup:
            parser.error(f"--steps must be above twice --warmup ({2 * args.warmup})")
        probe = run_child("probe", {}, cpu=False)
        if not probe["gpus"]:
            built = "with CUDA" if probe["cuda"] else "without CUDA"
            print(
                f"bench/gpu.py: no GPU here (TensorFlow {probe['tf']} {built} sees none); "
                "nothing measured (--cpu-smoke runs a tiny CPU version)"
            )
            return 0
        settings = [Setting(m, p, x) for m in args.models for p in args.precision for x in args.xla]
        sizes = Sizes(BATCH, args.steps, args.warmup, args.target, args.eval_every, args.max_steps)
        gpus = len(probe["gpus"])
        device = f"{gpus} x {probe['gpus'][0]}, TensorFlow {probe['tf']}"
    from trainer.data import resolve_data_dir

    data_dir = str(resolve_data_dir(args.data_dir))  # downloads once, before timing
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        rows = bench(settings, sizes, data_dir, gpus, args.cpu_smoke, Path(tmp))
    report = {
        "device": device,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "sizes": asdict(sizes),
        "results": rows,
        "goals": None if args.cpu_smoke else goals(rows, sizes.target),
    }
    if not args.json_only:
        print(f"bench/gpu.py on {device}")
        print_table(rows)
    print(json.dumps(report, indent=None if args.json_only else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
