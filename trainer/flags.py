"""Command-line flags of ``python -m trainer`` and the run configuration
they make. Parsed before TensorFlow is imported, so ``--help`` and bad flags
(argparse: exit code 2) answer at once."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from trainer import catalog
from trainer.catalog import ENSEMBLE_MODELS, MIXED_PRECISION_MODELS, MODELS
from trainer.catalog import MODE_NAMES as MODES

NOISES = ("gaussian", "masking")

# Set (to anything but "", "0") by whoever starts the trainer on a node with
# an accelerator: the same as --require-gpu.
REQUIRE_GPU_ENV = "TFCLUSTER_REQUIRE_GPU"


@dataclass(frozen=True)
class Config:
    """Everything one task needs to know; the same on every task of a job."""

    model: str = "cnn"
    mode: str = "single"
    steps: int | None = 600
    epochs: float | None = None
    batch_size: int = 128
    learning_rate: float = 1e-3
    seed: int = 1
    output_dir: str = "runs/default"
    data_dir: str | None = None
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    resume: bool = False
    log_every: int = 20
    eval: bool = True
    average_every: int = 10
    steps_per_call: int = 10
    jit: bool = False
    overlap: bool = False
    mixed_precision: bool = False
    require_gpu: bool = False
    # Denoising autoencoders (dae, sdae).
    patch: int = 8
    stride: int = 4
    noise: str = "gaussian"
    noise_level: float = 0.3
    hidden: int = 256
    width_factor: float = 2.0
    pretrain_steps: int | None = None
    # Ensemble mode: member i trains ensemble_models[i % len] (empty: --model).
    ensemble_models: tuple[str, ...] = ()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer",
        description=(
            "Train an MNIST model on this task of a tfcluster job. The task's role comes "
            "from TF_CONFIG (none: one process); every task of a job gets the same flags."
        ),
    )
    p.add_argument("--model", choices=MODELS, default="cnn")
    p.add_argument(
        "--mode",
        choices=MODES,
        default="single",
        help="; ".join(f"{m.name}: {m.flag_help}" for m in catalog.MODES.values()),
    )
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=_positive_int, help="total global steps (default 600)")
    length.add_argument(
        "--epochs",
        type=_positive_float,
        help="passes over the training set by the whole job (instead of --steps)",
    )
    p.add_argument(
        "--batch-size",
        type=_positive_int,
        default=128,
        help="examples per worker per step (sync/average: the global batch is this times "
        "the workers)",
    )
    p.add_argument(
        "--learning-rate", type=_positive_float, help="Adam step size (default per model)"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--output-dir",
        help="run folder written by the chief (default: $TFCLUSTER_RUN_DIR, which the "
        "launcher sets, else ./runs/<UTC time>)",
    )
    p.add_argument(
        "--data-dir",
        help="folder of the official MNIST .gz files (else $MNIST_DIR, else downloaded once "
        "to $TFCLUSTER_CACHE/mnist or ~/.cache/tfcluster/mnist)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=_non_negative_int,
        default=100,
        help="steps between checkpoints (0: only the final one)",
    )
    p.add_argument(
        "--keep-checkpoints",
        type=_non_negative_int,
        default=3,
        help="newest checkpoints kept (0: every one, e.g. to evaluate each afterwards)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--log-every", type=_positive_int, default=20, help="steps between progress")
    p.add_argument(
        "--eval",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="evaluate on the held-out test images at the end",
    )
    p.add_argument(
        "--average-every",
        type=_positive_int,
        default=10,
        help="average mode: local steps between parameter averages",
    )
    p.add_argument(
        "--steps-per-call",
        type=_positive_int,
        default=10,
        help="steps run inside one tf.function call (one scheduled closure in async mode)",
    )
    p.add_argument(
        "--jit",
        "--xla",
        dest="jit",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="XLA-compile the forward and backward pass",
    )
    p.add_argument(
        "--mixed-precision",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="cnn, convnet: compute in float16 (variables stay float32) with dynamic loss "
        "scaling; pays off on GPUs with tensor cores, slows a CPU down",
    )
    p.add_argument(
        "--require-gpu",
        action="store_true",
        help=f"fail (exit 7) instead of training on the CPU when TensorFlow sees no GPU "
        f"(also when ${REQUIRE_GPU_ENV} is set, as on nodes with an accelerator)",
    )
    p.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="async: compute each step while the ps applies the previous one: hides the "
        "update and the transfers where a worker has its own machine, but each worker's "
        "gradients are one more update stale",
    )
    p.add_argument(
        "--ensemble-models",
        help="ensemble mode: comma-separated models, one per member in turn (chief, then "
        f"worker 0, 1...), from {', '.join(ENSEMBLE_MODELS)} (default: --model for all)",
    )
    ae = p.add_argument_group("denoising autoencoders (dae, sdae)")
    ae.add_argument("--patch", type=_positive_int, default=8, help="patch side in pixels")
    ae.add_argument("--stride", type=_positive_int, default=4, help="pixels between patches")
    ae.add_argument("--noise", choices=NOISES, default="gaussian")
    ae.add_argument(
        "--noise-level",
        type=_positive_float,
        default=0.3,
        help="gaussian: standard deviation; masking: fraction of pixels zeroed",
    )
    ae.add_argument("--hidden", type=_positive_int, default=256, help="(first) hidden layer")
    ae.add_argument(
        "--width-factor",
        type=_positive_float,
        default=2.0,
        help="sdae: the second hidden layer is this many times wider than the first",
    )
    ae.add_argument(
        "--pretrain-steps",
        type=_positive_int,
        help="sdae: greedy pretraining steps per layer (default a quarter of the steps each)",
    )
    return p


def env_requires_gpu() -> bool:
    return os.environ.get(REQUIRE_GPU_ENV, "").strip() not in ("", "0")


def parse_args(argv: Sequence[str] | None = None) -> Config:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.patch > 28:
        parser.error(f"--patch {args.patch} is larger than the 28-pixel images")
    if args.stride > args.patch:
        parser.error("--stride larger than --patch would leave pixels out of every patch")
    if args.noise == "masking" and args.noise_level >= 1:
        parser.error("--noise-level for masking noise is a fraction below 1")
    if args.mixed_precision and args.model not in MIXED_PRECISION_MODELS:
        parser.error(
            f"--mixed-precision is for {' and '.join(MIXED_PRECISION_MODELS)}, not {args.model}"
        )
    if args.mixed_precision and not catalog.mode(args.mode).mixed_precision:
        # (GPUs train in single or sync mode; catalog.py says why not others.)
        takes = [m.name for m in catalog.MODES.values() if m.mixed_precision]
        parser.error(
            f"--mixed-precision is for modes {', '.join(takes[:-1])} and {takes[-1]}, "
            f"not {args.mode}"
        )
    ensemble_models = _ensemble_models(parser, args)
    steps = args.steps if args.steps is not None or args.epochs is not None else 600
    if args.model == "sdae" and steps is not None:
        pretrain = args.pretrain_steps or max(1, steps // 4)
        if 2 * pretrain >= steps:
            parser.error(
                f"--pretrain-steps {pretrain} for both layers leaves no fine-tuning in "
                f"{steps} steps"
            )
    output_dir = (
        args.output_dir
        or os.environ.get("TFCLUSTER_RUN_DIR")
        or "runs/" + datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    )
    return Config(
        model=args.model,
        mode=args.mode,
        steps=steps,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate or catalog.model(args.model).learning_rate,
        seed=args.seed,
        output_dir=output_dir,
        data_dir=args.data_dir,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        resume=args.resume,
        log_every=args.log_every,
        eval=args.eval,
        average_every=args.average_every,
        steps_per_call=args.steps_per_call,
        jit=args.jit,
        overlap=args.overlap,
        mixed_precision=args.mixed_precision,
        require_gpu=args.require_gpu or env_requires_gpu(),
        patch=args.patch,
        stride=args.stride,
        noise=args.noise,
        noise_level=args.noise_level,
        hidden=args.hidden,
        width_factor=args.width_factor,
        pretrain_steps=args.pretrain_steps,
        ensemble_models=ensemble_models,
    )


def _ensemble_models(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, ...]:
    """--ensemble-models, checked: classifiers only (an ensemble averages
    class probabilities), and only with --mode ensemble."""
    if args.mode != "ensemble":
        if args.ensemble_models:
            parser.error("--ensemble-models goes with --mode ensemble")
        return ()
    if args.resume:
        parser.error("--mode ensemble does not resume: members' checkpoints stay on their nodes")
    models = tuple(m.strip() for m in (args.ensemble_models or args.model).split(","))
    for model in models:
        if model not in ENSEMBLE_MODELS:
            parser.error(
                f"--mode ensemble averages classifiers: {model!r} is not one of "
                f"{', '.join(ENSEMBLE_MODELS)}"
            )
    return models if args.ensemble_models else ()
