"""Command-line flags of ``python -m trainer`` and the run configuration
they make. Parsed before TensorFlow is imported, so ``--help`` and bad flags
(argparse: exit code 2) answer at once."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from trainer import catalog
from trainer.catalog import ENSEMBLE_MODELS, MIXED_PRECISION_MODELS
from trainer.options import Option, non_negative_int, positive_float, positive_int

# Set (to anything but "", "0") by whoever starts the trainer on a node with
# an accelerator: the same as --require-gpu.
REQUIRE_GPU_ENV = "TFCLUSTER_REQUIRE_GPU"
LR_SCHEDULES = ("cosine", "constant")


@dataclass(frozen=True)
class Config:
    """Everything one task needs to know; the same on every task of a job."""

    model: str = catalog.DEFAULT_MODEL
    mode: str = catalog.DEFAULT_MODE
    steps: int | None = 600
    epochs: float | None = None
    batch_size: int = 128
    learning_rate: float = 1e-3
    # "cosine": the step size decays from learning_rate to 0 over each
    # phase's steps; "constant": learning_rate throughout.
    lr_schedule: str = "cosine"
    # Test-set evaluation every this many epochs during training (None: only
    # at the end, with --eval).
    eval_every: float | None = None
    seed: int = 1
    output_dir: str = "runs/default"
    data_dir: str | None = None
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    resume: bool = False
    log_every: int = 20
    eval: bool = True
    steps_per_call: int = 10
    jit: bool = False
    mixed_precision: bool = False
    require_gpu: bool = False
    # Ensemble mode: member i trains ensemble_models[i % len] (empty: --model).
    ensemble_models: tuple[str, ...] = ()
    # The models' and modes' own options (catalog entries' ``options``) by
    # key, every one of them: ``options["noise_level"]`` for --noise-level.
    options: Mapping[str, Any] = field(default_factory=catalog.option_defaults)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer",
        description=(
            "Train an MNIST model on this task of a tfcluster job. The task's role comes "
            "from TF_CONFIG (none: one process); every task of a job gets the same flags."
        ),
    )
    _add_run_flags(p)
    _add_output_flags(p)
    _add_performance_flags(p)
    _add_options(p, catalog.options())
    return p


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    """What trains, and for how long."""
    # The catalog as it is now: a test registers a toy model and mode.
    p.add_argument("--model", choices=tuple(catalog.MODEL_SPECS), default=catalog.DEFAULT_MODEL)
    p.add_argument(
        "--mode",
        choices=tuple(catalog.MODES),
        default=catalog.DEFAULT_MODE,
        help="; ".join(f"{m.name}: {m.flag_help}" for m in catalog.MODES.values()),
    )
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=positive_int, help="total global steps (default 600)")
    length.add_argument(
        "--epochs",
        type=positive_float,
        help="passes over the training set by the whole job (instead of --steps)",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=128,
        help="examples per worker per step (sync/average: the global batch is this times "
        "the workers)",
    )
    p.add_argument(
        "--learning-rate", type=positive_float, help="Adam step size (default per model)"
    )
    p.add_argument(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        help="cosine: the step size decays from --learning-rate to 0 over the run (each "
        "phase's steps); constant: --learning-rate throughout (default per model: cosine "
        "for cnn and convnet, constant for dae and sdae)",
    )
    p.add_argument("--seed", type=int, default=1)


def _add_output_flags(p: argparse.ArgumentParser) -> None:
    """Where the data and the outputs are: the run folder, its checkpoints,
    progress and evaluations."""
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
        type=non_negative_int,
        default=100,
        help="steps between checkpoints (0: only the final one)",
    )
    p.add_argument(
        "--keep-checkpoints",
        type=non_negative_int,
        default=3,
        help="newest checkpoints kept (0: every one, e.g. to evaluate each afterwards)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--log-every", type=positive_int, default=20, help="steps between progress")
    p.add_argument(
        "--eval",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="evaluate on the held-out test images at the end",
    )
    p.add_argument(
        "--eval-every",
        type=positive_float,
        metavar="EPOCHS",
        help="also evaluate on the held-out test images every EPOCHS epochs (e.g. 0.5) "
        "while training: an `eval` progress event and summary.json's evaluations",
    )


def _add_performance_flags(p: argparse.ArgumentParser) -> None:
    """How the steps run: per call, compiled, in which precision, on what."""
    p.add_argument(
        "--steps-per-call",
        type=positive_int,
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
        "--ensemble-models",
        help="ensemble mode: comma-separated models, one per member in turn (chief, then "
        f"worker 0, 1...), from {', '.join(ENSEMBLE_MODELS)} (default: --model for all)",
    )


def _add_options(p: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """The models' and modes' own options: ungrouped ones with the general
    flags, the others in their ``--help`` sections, in catalog order."""
    groups: dict[str | None, Any] = {None: p}
    for option in options:
        if option.group not in groups:
            groups[option.group] = p.add_argument_group(option.group)
        target = groups[option.group]
        if option.switch:
            target.add_argument(
                option.flag,
                action=argparse.BooleanOptionalAction,
                default=option.default,
                help=option.help,
            )
        else:
            target.add_argument(
                option.flag,
                type=option.type,
                default=option.default,
                choices=option.choices,
                help=option.help,
            )


def env_requires_gpu() -> bool:
    return os.environ.get(REQUIRE_GPU_ENV, "").strip() not in ("", "0")


def parse_args(argv: Sequence[str] | None = None) -> Config:
    parser = build_parser()
    args = parser.parse_args(argv)
    options = {option.key: getattr(args, option.key) for option in catalog.options()}
    _check_options(parser, options)
    _check_mixed_precision(parser, args)
    ensemble_models = _ensemble_models(parser, args)
    steps = args.steps if args.steps is not None or args.epochs is not None else 600
    model = catalog.model(args.model)
    error = model.check_run(options, steps) if model.check_run is not None else None
    if error is not None:
        parser.error(error)
    return Config(
        model=args.model,
        mode=args.mode,
        steps=steps,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate or model.learning_rate,
        lr_schedule=args.lr_schedule or model.lr_schedule,
        eval_every=args.eval_every,
        seed=args.seed,
        output_dir=_output_dir(args),
        data_dir=args.data_dir,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        resume=args.resume,
        log_every=args.log_every,
        eval=args.eval,
        steps_per_call=args.steps_per_call,
        jit=args.jit,
        mixed_precision=args.mixed_precision,
        require_gpu=args.require_gpu or env_requires_gpu(),
        ensemble_models=ensemble_models,
        options=options,
    )


def _check_options(parser: argparse.ArgumentParser, options: Mapping[str, Any]) -> None:
    """Every model's checks of its options among themselves: they are flags
    of every run, whichever model trains."""
    checks = [m.check_options for m in catalog.MODEL_SPECS.values() if m.check_options]
    for check in dict.fromkeys(checks):  # a check shared by two models runs once
        error = check(options)
        if error is not None:
            parser.error(error)


def _check_mixed_precision(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
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


def _output_dir(args: argparse.Namespace) -> str:
    return str(
        args.output_dir
        or os.environ.get("TFCLUSTER_RUN_DIR")
        or "runs/" + datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    )


def _ensemble_models(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, ...]:
    """--ensemble-models, checked: classifiers only (an ensemble averages
    class probabilities), and only with --mode ensemble."""
    if not catalog.mode(args.mode).members:
        if args.ensemble_models:
            modes = " or ".join(catalog.member_modes())
            parser.error(f"--ensemble-models goes with --mode {modes}")
        return ()
    if args.resume:
        parser.error(
            f"--mode {args.mode} does not resume: members' checkpoints stay on their nodes"
        )
    models = tuple(m.strip() for m in (args.ensemble_models or args.model).split(","))
    for model in models:
        if model not in ENSEMBLE_MODELS:
            parser.error(
                f"--mode {args.mode} averages classifiers: {model!r} is not one of "
                f"{', '.join(ENSEMBLE_MODELS)}"
            )
    return models if args.ensemble_models else ()
