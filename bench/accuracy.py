"""Time to accuracy of the MNIST CNN in each training mode, in one run.

Trains the cnn with the trainer's default recipe (Adam, the cosine
learning-rate schedule, 128 examples per worker step) for ``--epochs``
passes over the training set in each mode, one after the other, on local
processes pinned as bench/trainer.py pins them, and scores the held-out
test set every ``--eval-every`` epochs (the trainer's ``--eval-every``).
Prints, per mode, the training time (evaluations left out) until the test
accuracy first reached 98.5 %, 99.0 % and 99.2 %, and the final accuracy;
as a table and as JSON.

Modes: single (one process), async1 and async2 (a ps and 1 or 2 workers),
sync2, average2, ensemble2 and layers2 (2 training processes each).

Meant for the whole MNIST (60,000 training images; ``--data-dir``, else
$MNIST_FULL_DIR, else $MNIST_DIR); ``--smoke`` runs a quarter epoch, to see
that every mode runs (the 8,000-image subset will do).

Usage: ``python bench/accuracy.py [--modes single,async2] [--epochs 5]
[--eval-every 0.5] [--smoke] [--json-only] [--json-out FILE]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.support.loopback import LocalJob, read_summary  # noqa: E402
from bench.support.output import emit  # noqa: E402
from bench.trainer import placement  # noqa: E402

# Name -> (trainer mode, workers, ps).
MODES: dict[str, tuple[str, int, int]] = {
    "single": ("single", 1, 0),
    "async1": ("async", 1, 1),
    "async2": ("async", 2, 1),
    "sync2": ("sync", 2, 0),
    "average2": ("average", 2, 0),
    "ensemble2": ("ensemble", 2, 0),
    "layers2": ("layers", 2, 0),
}
TARGETS = (0.985, 0.990, 0.992)


def train(name: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One mode's run: its summary.json, with the load average around it."""
    mode, workers, ps = MODES[name]
    output = root / name
    job = LocalJob(
        mode=mode,
        argv=["--model", "cnn", "--epochs", str(args.epochs), "--eval-every",
              str(args.eval_every), "--batch-size", str(args.batch_size),
              "--checkpoint-every", "0", "--log-every", "100", "--data-dir", args.data_dir,
              "--output-dir", str(output)],
        log_dir=root / f"{name}-logs",
        workers=workers,
        ps=ps,
        cpus=placement(mode, workers, ps) if args.pin else {},
    )  # fmt: skip
    load = os.getloadavg()[0]
    began = time.monotonic()
    try:
        job.start()
        if job.wait(args.timeout) != 0:
            raise RuntimeError(f"{name} failed\n{job.logs()}")
    finally:
        job.stop()
    summary = read_summary(output)
    summary["bench"] = {
        "wall_s": time.monotonic() - began,
        "load": [load, os.getloadavg()[0]],
    }
    return summary


def time_to(summary: dict[str, Any]) -> dict[str, Any]:
    """Training seconds (and epochs) to each target accuracy; None: not reached.
    The evaluations during training, then the final one (after the last step)."""
    final = {
        "epoch": summary["steps"] * summary["examples_per_step"] / summary["train_examples"],
        "train_s": summary["training_seconds"] - summary["evaluation_seconds"],
        "test_accuracy": summary["test_accuracy"],
    }
    rows = [*summary["evaluations"], final]
    found: dict[str, Any] = {}
    for target in TARGETS:
        row = next((r for r in rows if r["test_accuracy"] >= target), None)
        found[f"{target:.3f}"] = (
            None if row is None else {"train_s": row["train_s"], "epoch": row["epoch"]}
        )
    return found


def result(name: str, summary: dict[str, Any]) -> dict[str, Any]:
    train_s = summary["training_seconds"] - summary["evaluation_seconds"]
    return {
        "mode": summary["mode"],
        "workers": summary["workers"],
        "ps": summary["ps"],
        "steps": summary["steps"],
        "train_s": train_s,
        "examples_per_sec": summary["steps"] * summary["examples_per_step"] / train_s,
        "final_accuracy": summary["test_accuracy"],
        "time_to": time_to(summary),
        "accuracy_curve": [
            [r["epoch"], r["train_s"], r["test_accuracy"]] for r in summary["evaluations"]
        ],
        "wall_s": summary["bench"]["wall_s"],
        "load": summary["bench"]["load"],
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    heads = "".join(f"{'to ' + format(t, '.1%'):>12}" for t in TARGETS)
    lines = [f"{'mode':<11}{'steps':>6}{'ex/s':>7}{heads}{'final':>9}{'train s':>9}{'load':>6}"]
    for name, r in results.items():
        cells = ""
        for target in TARGETS:
            hit = r["time_to"][f"{target:.3f}"]
            shown = "-" if hit is None else f"{hit['train_s']:.0f} s @{hit['epoch']:.1f}"
            cells += f"{shown:>12}"
        lines.append(
            f"{name:<11}{r['steps']:>6}{r['examples_per_sec']:>7.0f}{cells}"
            f"{r['final_accuracy']:>9.2%}{r['train_s']:>9.0f}{r['load'][0]:>6.1f}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES)}")  # fmt: skip
    parser.add_argument("--epochs", type=float, default=5.0)
    parser.add_argument("--eval-every", type=float, default=0.5, help="epochs")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--smoke", action="store_true",
                        help="a quarter epoch, scored twice: that every mode runs")  # fmt: skip
    parser.add_argument(
        "--data-dir", default=os.environ.get("MNIST_FULL_DIR") or os.environ.get("MNIST_DIR")
    )
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument("--json-out", type=Path, help="also write the JSON report here")
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=len(os.sched_getaffinity(0)) >= 2,
        help="one core per computing task, as bench/trainer.py pins (default on 2+ CPUs)",
    )
    args = parser.parse_args()
    names = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not names or any(m not in MODES for m in names):
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    if args.smoke:
        args.epochs, args.eval_every = 0.25, 0.125
    from trainer.data.mnist import count_examples, resolve_data_dir

    data_dir = resolve_data_dir(args.data_dir)
    args.data_dir = str(data_dir)
    args.timeout = 600 if args.smoke else 4 * 3600
    train_examples = count_examples(data_dir, "train")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-accuracy-") as tmp:
        for name in names:
            summary = train(name, args, Path(tmp))
            summary["train_examples"] = train_examples
            results[name] = result(name, summary)
            if not args.json_only:
                print(f"{name}: {results[name]['final_accuracy']:.2%} after "
                      f"{results[name]['train_s']:.0f} s", flush=True)  # fmt: skip
    report = {
        "model": "cnn",
        "train_examples": train_examples,
        "epochs": args.epochs,
        "eval_every": args.eval_every,
        "batch_size": args.batch_size,
        "cpus": len(os.sched_getaffinity(0)),
        "pinned": args.pin,
        "targets": list(TARGETS),
        "results": results,
    }
    emit(report, table(results), json_only=args.json_only, json_out=args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
