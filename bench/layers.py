"""Model parallelism against one process, measured in one run.

Trains the convnet (its dense layer alone is 205 MB of the model's 219 MB)
three ways, one after the other on this machine, and prints them side by
side, as a table and as JSON:

* ``single``: one process holds and computes the whole model;
* ``layers`` over 2 worker tasks (and a chief that feeds them): each task
  holds a block of consecutive layers, activations and gradients cross
  between them over gRPC (loopback here);
* the same with ``--micro-batches`` (GPipe): the batch cut into pieces that
  flow through the stages one after the other.

For each: steady steps/s and examples/s (the first log interval, which
traces and connects, left out), the ratio to ``single``, the parameter bytes
each task holds, and for ``layers`` the measured bubble (the share of a step
each stage waits) and GPipe's bubble for equal stages. Model parallelism
does not make a model that fits one task faster: it makes a model that does
not fit possible, and this measures what it costs.

Usage: ``python bench/layers.py [--steps N] [--batch-size N] [--micro-batches M]
[--model convnet] [--json-only]`` (MNIST from --data-dir or $MNIST_DIR).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.support.loopback import LocalJob, read_summary  # noqa: E402
from bench.support.output import emit  # noqa: E402


def run(
    name: str, mode: str, args: argparse.Namespace, data_dir: str, root: Path, extra: list[str]
) -> dict[str, Any]:
    output = root / name
    job = LocalJob(
        mode=mode,
        argv=["--model", args.model, "--steps", str(args.steps), "--batch-size",
              str(args.batch_size), "--log-every", str(args.warmup), "--checkpoint-every", "0",
              "--no-eval", "--data-dir", data_dir, "--output-dir", str(output), *extra],
        log_dir=root / f"{name}-logs",
        workers=2 if mode == "layers" else 1,
    )  # fmt: skip
    try:
        job.start()
        if job.wait(3600) != 0:
            raise RuntimeError(f"{name} failed\n{job.logs()}")
    finally:
        job.stop()
    return read_summary(output)


def row(name: str, summary: dict[str, Any], batch_size: int) -> dict[str, Any]:
    speed = summary.get("steady_examples_per_sec", summary["examples_per_sec"])
    per_task = summary.get("params_per_device") or {}
    return {
        "setup": name,
        "steps_per_sec": speed / batch_size,
        "examples_per_sec": speed,
        "param_bytes_per_task": {
            device.split("/device:")[0] or device: size for device, size in per_task.items()
        },
        "bubble": summary.get("bubble"),
        "gpipe_bubble": summary.get("gpipe_bubble"),
        "micro_batches": summary.get("micro_batches"),
        "stage_seconds": summary.get("stage_seconds"),
    }


def single_params(model: str) -> dict[str, int]:
    """The whole model's bytes, on the one process of ``single``."""
    from trainer import catalog

    layers = catalog.model(model).layers
    assert layers is not None
    return {"/job:chief (single)": sum(x.bytes for x in layers(catalog.option_defaults()))}


def measure(args: argparse.Namespace, data_dir: str) -> list[dict[str, Any]]:
    setups = [
        ("single", "single", []),
        ("layers, 2 tasks", "layers", []),
        (f"layers, 2 tasks, {args.micro_batches} micro-batches", "layers",
         ["--micro-batches", str(args.micro_batches)]),
    ]  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-layers-") as tmp:
        for name, mode, extra in setups:
            summary = run(name.replace(" ", "").replace(",", "-"), mode, args, data_dir,
                          Path(tmp), extra)  # fmt: skip
            found = row(name, summary, args.batch_size)
            if mode == "single":
                found["param_bytes_per_task"] = single_params(args.model)
            rows.append(found)
    base = rows[0]["steps_per_sec"]
    for found in rows:
        found["vs_single"] = found["steps_per_sec"] / base if base else None
    return rows


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"{args.model}, batch {args.batch_size}, {args.steps} steps "
          f"(the first {args.warmup} left out)")  # fmt: skip
    print(f"{'setup':34} {'steps/s':>8} {'ex/s':>8} {'vs single':>9} {'bubble':>7} "
          f"{'GPipe':>6}  parameter MB per task")  # fmt: skip
    for r in rows:
        bubble = f"{r['bubble']:.2f}" if r["bubble"] is not None else "-"
        ideal = f"{r['gpipe_bubble']:.2f}" if r["gpipe_bubble"] is not None else "-"
        tasks = ", ".join(
            f"{task.rsplit('/', 1)[-1] if 'task:' in task else task} {size / 1e6:.1f}"
            for task, size in sorted(r["param_bytes_per_task"].items())
        )
        print(f"{r['setup']:34} {r['steps_per_sec']:8.2f} {r['examples_per_sec']:8.0f} "
              f"{r['vs_single']:8.2f}x {bubble:>7} {ideal:>6}  {tasks}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="convnet", choices=("cnn", "convnet"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the speed")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--data-dir")
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args()
    from trainer.data.mnist import resolve_data_dir

    data_dir = str(resolve_data_dir(args.data_dir))
    rows = measure(args, data_dir)
    if not args.json_only:
        print_table(rows, args)
    # One line with --json-only (was indented then, and one line without it).
    emit(rows, None, json_only=args.json_only)


if __name__ == "__main__":
    main()
