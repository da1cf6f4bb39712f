"""Trainer throughput against plain Keras, measured in one run.

Trains the MNIST CNN with the same batch size in five set-ups, one after the
other on this machine, and prints examples/s as a table and as JSON, with
ratios against plain Keras ``model.fit`` and against the trainer's
``single`` mode:

* plain Keras ``fit`` (one process, Keras' defaults, XLA included);
* ``python -m trainer --mode single``;
* ``async`` with 1 ps + 1 worker (plain, and with ``--overlap``), and with
  1 ps + 2 workers;
* ``sync`` with 2 workers.

With ``--repeat N`` every set-up runs N times, in rounds (each round runs
all set-ups once), and the median is reported: the machine's speed drifts
by 10 % and more over minutes, and rounds spread that drift over all
set-ups alike.

Throughput is steady state: the first log interval (tracing, compiling,
connecting) is left out, for Keras too. Targets: single >= 0.95x plain
Keras, async with 1 worker >= 0.8x single.

Every process would otherwise share all of this machine's cores, and the
ps's work (serving 13 MB of parameters and taking 13 MB of gradients per
step) would be taken from the worker's compute: that measures this machine,
not distribution. With ``--pin`` (the default on 2 or more CPUs) each task is
pinned as if it had a machine of one core: the computing process (Keras,
single, each async worker, each sync task) on its own core where there are
enough, the ps and the async chief (which only schedules) on the last core.
Then "async 1 worker vs single" compares the same compute per worker, with
and without a parameter server across the network. ``--no-pin`` measures
the shared machine.

Usage: ``python bench/trainer.py [--steps N] [--batch-size N] [--repeat N] [--json-only]``
(MNIST from --data-dir or $MNIST_DIR, as for the trainer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.peer_programs.common import cnn  # noqa: E402
from bench.support.loopback import LocalJob, read_summary, task_env  # noqa: E402

WARMUP_STEPS = 25


def keras_fit(steps: int, batch_size: int, data_dir: str, warmup: int = WARMUP_STEPS) -> float:
    """Examples/s of plain Keras fit after a warm-up epoch (runs in a child
    process so that every set-up starts from a fresh TensorFlow)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from trainer.data.mnist import load_split, resolve_data_dir

    train = load_split(resolve_data_dir(data_dir), "train")
    x = train.images[..., None].astype(np.float32) / 255.0
    y = train.labels.astype(np.int32)
    model = cnn(keras)
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    data = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(y), seed=1)
        .repeat()
        .batch(batch_size)
        .prefetch(tf.data.AUTOTUNE)
    )
    model.fit(data, steps_per_epoch=warmup, epochs=1, verbose=0)
    start = time.perf_counter()
    model.fit(data, steps_per_epoch=steps - warmup, epochs=1, verbose=0)
    return (steps - warmup) * batch_size / (time.perf_counter() - start)


def placement(mode: str, workers: int, ps: int) -> dict[str, set[int]]:
    """Task name -> CPUs: one core per computing task where there are
    enough (round robin over the cores left), the ps and the async chief on
    the last core."""
    cores = sorted(os.sched_getaffinity(0))
    serving, computing = cores[-1:], cores[:-1] or cores
    if mode == "single":
        return {"chief-0": {cores[0]}}
    if mode == "async":
        out = {f"ps-{i}": set(serving) for i in range(ps)}
        out["chief-0"] = set(serving)
        out.update({f"worker-{i}": {computing[i % len(computing)]} for i in range(workers)})
        return out
    trainers = ["chief-0", *(f"worker-{i}" for i in range(workers - 1))]
    return {name: {cores[i % len(cores)]} for i, name in enumerate(trainers)}


def run_keras(
    steps: int, batch_size: int, data_dir: str, pin: bool, warmup: int = WARMUP_STEPS
) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--keras-child", "--steps", str(steps), "--warmup",
         str(warmup), "--batch-size", str(batch_size), "--data-dir", data_dir],
        env=task_env(), capture_output=True, text=True, check=True,
        preexec_fn=_pin_to(placement("single", 1, 0)["chief-0"]) if pin else None,
    )  # fmt: skip
    return float(out.stdout.strip().splitlines()[-1])


def median_run(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The set-up's median examples/s over the rounds, with every round's."""
    speeds = [e["examples_per_sec"] for e in entries]
    return {**entries[0], "examples_per_sec": statistics.median(speeds), "rounds": speeds}


def _pin_to(cpus: set[int]) -> Any:
    return lambda: os.sched_setaffinity(0, cpus)


def run_trainer(
    mode: str,
    workers: int,
    ps: int,
    steps: int,
    batch_size: int,
    data_dir: str,
    root: Path,
    pin: bool,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    name = f"{mode}-{workers}w-{ps}ps{''.join(extra)}"
    output = root / name
    job = LocalJob(
        mode=mode,
        argv=["--model", "cnn", "--steps", str(steps), "--batch-size", str(batch_size),
              "--log-every", str(WARMUP_STEPS), "--checkpoint-every", "0", "--no-eval",
              "--data-dir", data_dir, "--output-dir", str(output), *extra],
        log_dir=root / f"{name}-logs",
        workers=workers,
        ps=ps,
        cpus=placement(mode, workers, ps) if pin else {},
    )  # fmt: skip
    try:
        job.start()
        if job.wait(1800) != 0:
            raise RuntimeError(f"{name} failed\n{job.logs()}")
    finally:
        job.stop()
    return read_summary(output)


# (key, mode, workers, ps, extra trainer flags)
SETUPS: list[tuple[str, str, int, int, tuple[str, ...]]] = [
    ("single", "single", 1, 0, ()),
    ("async_1ps_1worker", "async", 1, 1, ()),
    ("async_1ps_1worker_overlap", "async", 1, 1, ("--overlap",)),
    ("async_1ps_2workers", "async", 2, 1, ()),
    ("sync_2workers", "sync", 2, 0, ()),
]


def measure(args: argparse.Namespace, data_dir: str) -> dict[str, list[dict[str, Any]]]:
    """Keras fit, then every set-up, in each of ``--repeat`` rounds."""
    runs: dict[str, list[dict[str, Any]]] = {"keras_fit": []}
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        for round_ in range(args.repeat):
            speed = run_keras(args.steps, args.batch_size, data_dir, args.pin)
            runs["keras_fit"].append({"examples_per_sec": speed})
            for key, mode, workers, ps, extra in SETUPS:
                summary = run_trainer(
                    mode, workers, ps, args.steps, args.batch_size, data_dir,
                    Path(tmp) / f"round-{round_}", args.pin, extra,
                )  # fmt: skip
                runs.setdefault(key, []).append(
                    {
                        "examples_per_sec": summary["steady_examples_per_sec"],
                        "examples_per_sec_with_warmup": summary["examples_per_sec"],
                        "workers": summary["workers"],
                        "ps": summary["ps"],
                    }
                )
    return runs


def make_report(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    """Each set-up's median run, against Keras fit's and single's."""
    results = {key: median_run(entries) for key, entries in runs.items()}
    keras_speed = results["keras_fit"]["examples_per_sec"]
    single = results["single"]["examples_per_sec"]
    for entry in results.values():
        entry["vs_keras_fit"] = entry["examples_per_sec"] / keras_speed
        entry["vs_single"] = entry["examples_per_sec"] / single
    return {
        "model": "cnn",
        "batch_size": args.batch_size,
        "steps": args.steps,
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "pinned": args.pin,
        "placement": {
            key: {k: sorted(v) for k, v in placement(mode, workers, ps).items()}
            for key, mode, workers, ps, _ in SETUPS
        }
        if args.pin
        else None,
        "results": results,
        "targets": {
            "single_vs_keras_fit >= 0.95": results["single"]["vs_keras_fit"] >= 0.95,
            "async_1ps_1worker_vs_single >= 0.8": results["async_1ps_1worker"]["vs_single"] >= 0.8,
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--data-dir", default=os.environ.get("MNIST_DIR"))
    parser.add_argument("--repeat", type=int, default=1, choices=range(1, 11), metavar="N",
                        help="rounds (1-10); medians are reported")  # fmt: skip
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=len(os.sched_getaffinity(0)) >= 2,
        help="one core per task, as if each had its own machine (default on 2+ CPUs)",
    )
    parser.add_argument("--keras-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=WARMUP_STEPS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.keras_child:
        print(keras_fit(args.steps, args.batch_size, args.data_dir, args.warmup))
        return 0
    if args.steps <= 2 * WARMUP_STEPS:
        parser.error(f"--steps must be above {2 * WARMUP_STEPS}")
    from trainer.data.mnist import resolve_data_dir

    data_dir = str(resolve_data_dir(args.data_dir))  # download once, before timing
    report = make_report(measure(args, data_dir), args)
    if not args.json_only:
        print(f"{'set-up':<27}{'examples/s':>12}{'vs keras fit':>14}{'vs single':>11}")
        for key, entry in report["results"].items():
            print(
                f"{key:<27}{entry['examples_per_sec']:>12.0f}"
                f"{entry['vs_keras_fit']:>13.2f}x{entry['vs_single']:>10.2f}x"
            )
    print(json.dumps(report, indent=None if args.json_only else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
