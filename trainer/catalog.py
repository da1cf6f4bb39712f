"""The built-in trainer's models and training modes, named once.

Plain Python, importable without TensorFlow: ``trainer/flags.py`` offers
these choices to ``python -m trainer``, and the launcher (cluster.yaml's
``job``, ``deploy.py train``'s choices, which tasks a job starts, which
held-out figure ``deploy.py report`` shows) reads them from here instead of
restating them.

Each entry names the module that implements it on the TensorFlow side
(imported only by the trainer, only when it trains):

* a model: ``Model(...)`` below and a module under ``trainer/models/`` with
  ``create_task(config) -> Task`` (``trainer/models/base.py``). Two files;
  its own command-line options (``trainer/options.py``) are listed in its
  entry, and it reads them from ``config.options``.
* a mode: ``Mode(...)`` below and a module under ``trainer/modes/`` with
  ``MODE``, a ``TrainingMode`` (``trainer/modes/base.py``). Two files; a
  third (``trainer/distribution/strategy.py``) only for a kind of strategy none of
  the modes uses yet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainer.layers import architectures, stages
from trainer.layers.architectures import ARCHITECTURES, LayerSpec
from trainer.options import (
    Check,
    JobCheck,
    JobFacts,
    Option,
    RunCheck,
    positive_float,
    positive_int,
    values_from_argv,
)


@dataclass(frozen=True)
class Model:
    """A model: where its ``create_task`` is, and the facts flags and the
    report need before TensorFlow is imported."""

    name: str
    module: str
    # Adam step size that converges within a few hundred steps on MNIST.
    learning_rate: float
    # Its --lr-schedule unless one is given. The classifiers decay (cosine:
    # the cnn's async 5 epochs, 99.19 % -> 99.38 %); the autoencoders keep a
    # constant rate: a cosine over sdae's 150-step pretraining phases halved
    # its PSNR gain in 600 steps (6.1 -> 3.5 dB, tests/trainer).
    lr_schedule: str = "cosine"
    # A classifier: an ensemble can average its class probabilities.
    classifier: bool = False
    # Its losses cast float16 outputs back to float32 (--mixed-precision).
    mixed_precision: bool = False
    # Its final held-out figure: (metrics.jsonl's training metric of the same
    # kind, summary.json key, label), or None.
    final_metric: tuple[str, str, str] | None = None
    # Its own command-line options: flags of every run (the same Option in
    # two models' entries is one flag), in ``Config.options`` by key.
    options: tuple[Option, ...] = ()
    # Its options' values among themselves: checked whichever model trains.
    check_options: Check | None = None
    # Checked when it trains: its options against the run's steps.
    check_run: RunCheck | None = None
    # Its layers in call order, given its options (``--mode layers`` cuts
    # them into stages); None: not split into layers.
    layers: Callable[[Mapping[str, Any]], tuple[LayerSpec, ...]] | None = None


_ACCURACY = ("accuracy", "test_accuracy", "test accuracy")
_PSNR = ("psnr", "psnr_reconstructed", "test PSNR")

_AE = "denoising autoencoders (dae, sdae)"
NOISES = ("gaussian", "masking")
_DENOISING = (
    Option("patch", positive_int, 8, "patch side in pixels", group=_AE),
    Option("stride", positive_int, 4, "pixels between patches", group=_AE),
    Option("noise", str, "gaussian", choices=NOISES, group=_AE),
    Option(
        "noise-level",
        positive_float,
        0.3,
        "gaussian: standard deviation; masking: fraction of pixels zeroed",
        group=_AE,
    ),
    Option("hidden", positive_int, 256, "(first) hidden layer", group=_AE),
)
_STACKED = (
    *_DENOISING,
    Option(
        "width-factor",
        positive_float,
        2.0,
        "sdae: the second hidden layer is this many times wider than the first",
        group=_AE,
    ),
    Option(
        "pretrain-steps",
        positive_int,
        help="sdae: greedy pretraining steps per layer (default a quarter of the steps each)",
        group=_AE,
    ),
)


def _check_patches(values: Mapping[str, Any]) -> str | None:
    if values["patch"] > 28:
        return f"--patch {values['patch']} is larger than the 28-pixel images"
    if values["stride"] > values["patch"]:
        return "--stride larger than --patch would leave pixels out of every patch"
    if values["noise"] == "masking" and values["noise_level"] >= 1:
        return "--noise-level for masking noise is a fraction below 1"
    return None


def _check_pretraining(values: Mapping[str, Any], steps: int | None) -> str | None:
    if steps is None:
        return None
    pretrain = values["pretrain_steps"] or max(1, steps // 4)
    if 2 * pretrain >= steps:
        return f"--pretrain-steps {pretrain} for both layers leaves no fine-tuning in {steps} steps"
    return None


# The source material's CNN used 1e-4 for 20,000 steps; tfcluster's runs are short.
def _classifier(name: str) -> Callable[[Mapping[str, Any]], tuple[LayerSpec, ...]]:
    return lambda options: architectures.classifier_layers(ARCHITECTURES[name])


_MODELS = (
    Model(
        "cnn",
        module="trainer.models.classifier",
        learning_rate=1e-3,
        classifier=True,
        mixed_precision=True,
        final_metric=_ACCURACY,
        layers=_classifier("cnn"),
    ),
    Model(
        "convnet",
        module="trainer.models.classifier",
        learning_rate=1e-3,
        classifier=True,
        mixed_precision=True,
        final_metric=_ACCURACY,
        layers=_classifier("convnet"),
    ),
    Model(
        "dae",
        module="trainer.models.dae",
        learning_rate=3e-3,
        lr_schedule="constant",
        final_metric=_PSNR,
        options=_DENOISING,
        check_options=_check_patches,
        layers=architectures.dae_layers,
    ),
    Model(
        "sdae",
        module="trainer.models.sdae",
        learning_rate=3e-3,
        lr_schedule="constant",
        final_metric=_PSNR,
        options=_STACKED,
        check_options=_check_patches,
        check_run=_check_pretraining,
        layers=architectures.sdae_layers,
    ),
)
MODEL_SPECS: dict[str, Model] = {m.name: m for m in _MODELS}
MODELS = tuple(MODEL_SPECS)
# The models an ensemble can average: the classifiers.
ENSEMBLE_MODELS = tuple(m.name for m in _MODELS if m.classifier)
MIXED_PRECISION_MODELS = tuple(m.name for m in _MODELS if m.mixed_precision)


def model(name: str) -> Model:
    """The model called ``name``; ValueError naming the choices otherwise."""
    try:
        return MODEL_SPECS[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; expected one of {', '.join(MODEL_SPECS)}"
        ) from None


def final_metrics() -> tuple[tuple[str, str, str], ...]:
    """Every model's final held-out figure, once each, in model order (the
    order a report prefers them in)."""
    found: list[tuple[str, str, str]] = []
    for entry in MODEL_SPECS.values():
        if entry.final_metric is not None and entry.final_metric not in found:
            found.append(entry.final_metric)
    return tuple(found)


# The kinds of tf.distribute strategy a mode trains under
# (``trainer/distribution/strategy.py``'s ``create_strategy`` makes them).
PARAMETER_SERVER = "parameter_server"  # ParameterServerStrategy and a coordinator
COLLECTIVE = "collective"  # MultiWorkerMirroredStrategy
LOCAL = "local"  # MirroredStrategy over the local GPUs, else the default
# The default strategy, the chief connected to every task of TF_CONFIG
# (tf.config.experimental_connect_to_cluster): it places work on them itself.
REMOTE = "remote"
STRATEGIES = (PARAMETER_SERVER, COLLECTIVE, LOCAL, REMOTE)


@dataclass(frozen=True)
class Mode:
    """A training mode: its name, and which TensorFlow task types take part
    (TF_CONFIG's own names). The strategies want different clusters: a
    parameter server job needs ps tasks, an all-reduce job must not have any."""

    name: str
    task_types: tuple[str, ...]
    summary: str
    module: str
    # Its line in ``python -m trainer --help``.
    flag_help: str
    # One of STRATEGIES: made before anything else of TensorFlow's runs, so
    # named here rather than by the TensorFlow-side mode.
    strategy: str
    # ps and workers only serve; the chief drives them (and, started with
    # them, waits until they listen).
    workers_serve: bool = False
    # Takes --mixed-precision.
    mixed_precision: bool = True
    # Its own command-line options, as a model's (``Model.options``).
    options: tuple[Option, ...] = ()
    # Run by the launcher before any task starts (``JobCheck``).
    check_job: JobCheck | None = None
    # Each process trains a model of its own (``--ensemble-models`` names
    # them: classifiers, whose class probabilities are averaged); the
    # members' checkpoints stay on their nodes, so no --resume.
    members: bool = False

    @property
    def needs_ps(self) -> bool:
        return "ps" in self.task_types

    @property
    def needs_workers(self) -> bool:
        return "worker" in self.task_types

    @property
    def one_process(self) -> bool:
        """One process, no TF_CONFIG: what a sweep's trial runs, and the
        baseline a report compares a distributed run with."""
        return self.task_types == ("chief",)


def _check_layers_job(facts: JobFacts) -> list[str]:
    return stages.check_job(facts.model, _model_layers(facts), facts)


def _model_layers(facts: JobFacts) -> tuple[LayerSpec, ...] | None:
    entry = MODEL_SPECS[facts.model]
    return entry.layers(facts.options) if entry.layers is not None else None


# The modes that step one model in one step function (async, sync, single)
# take it: the cnn and convnet compute in bfloat16 where the hardware has it.
BFLOAT16 = Option(
    "bfloat16",
    default=None,
    help="async, sync, single: the cnn and convnet compute in bfloat16 (variables, "
    "gradients, Adam and the loss stay float32; no loss scaling needed): about 1.7x faster "
    "on a CPU with AVX512-BF16, at the same 5-epoch accuracy (README); default: where the "
    "CPU (AVX512-BF16, AMX) or GPUs (compute capability 8+) have it, without --mixed-precision",
    switch=True,
)

_MODES = (
    Mode(
        "async",
        ("chief", "ps", "worker"),
        "parameter server: variables on the ps, steps on the workers, no barrier",
        "trainer.modes.parameter_server",
        "parameter server",
        PARAMETER_SERVER,
        workers_serve=True,
        # Loss scaling would keep its scale on the ps and skip steps there.
        mixed_precision=False,
        options=(
            Option(
                "overlap",
                default=False,
                help="async: compute each step while the ps applies the previous one: hides "
                "the update and the transfers where a worker has its own machine, but each "
                "worker's gradients are one more update stale",
                switch=True,
            ),
            Option(
                "dense-on-ps",
                default=None,
                help="async: compute the cnn's and convnet's hidden dense layers on the ps "
                "that holds their weights (without --jit): their input and output cross "
                "instead of the weights and gradients, and the workers compute a fifth less "
                "(default: on without GPUs); turn off where the ps has no cores to spare",
                switch=True,
            ),
            BFLOAT16,
        ),
    ),
    Mode(
        "sync",
        ("chief", "worker"),
        "all-reduce of the gradients every step",
        "trainer.modes.sync",
        "all-reduce every step",
        COLLECTIVE,
        options=(BFLOAT16,),
    ),
    Mode(
        "average",
        ("chief", "worker"),
        "parameter averaging every --average-every steps",
        "trainer.modes.average",
        "parameter averaging every --average-every steps",
        COLLECTIVE,
        options=(
            Option(
                "average-every",
                positive_int,
                10,
                "average mode: local steps between parameter averages",
            ),
        ),
    ),
    Mode(
        "single",
        ("chief",),
        "one process, every local device",
        "trainer.modes.single",
        "one process (default)",
        LOCAL,
        options=(BFLOAT16,),
    ),
    Mode(
        "ensemble",
        ("chief", "worker"),
        "each process trains its own model on its own data shard; the chief scores "
        "every member and their average",
        "trainer.modes.ensemble",
        "each process trains its own model on its own data shard",
        COLLECTIVE,
        # The members train in a loop of their own: not built for it.
        mixed_precision=False,
        members=True,
    ),
    Mode(
        "layers",
        ("chief", "worker"),
        "model parallelism: each worker holds a block of consecutive layers",
        "trainer.modes.layers",
        "each worker task holds a block of the model's layers (model parallelism)",
        REMOTE,
        workers_serve=True,
        # The loss scale would live on the chief, its checks on every stage.
        mixed_precision=False,
        options=stages.OPTIONS,
        check_job=_check_layers_job,
    ),
)
MODES: dict[str, Mode] = {mode.name: mode for mode in _MODES}
MODE_NAMES = tuple(MODES)
# What `python -m trainer` trains without --mode: the one-process mode.
DEFAULT_MODE = "single"
DEFAULT_MODEL = "cnn"


def one_process(name: str | None) -> bool:
    """Whether ``name`` is a mode of one process (``Mode.one_process``);
    False for a name the catalog does not know (a run of an older version)."""
    entry = MODES.get(name) if name is not None else None
    return entry is not None and entry.one_process


def member_modes() -> tuple[str, ...]:
    """The modes whose processes train models of their own (``Mode.members``)."""
    return tuple(m.name for m in MODES.values() if m.members)


def mode(name: str) -> Mode:
    """The mode called ``name``; ValueError naming the choices otherwise."""
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(
            f"unknown mode {name!r}; expected one of {', '.join(MODE_NAMES)}"
        ) from None


def options() -> tuple[Option, ...]:
    """Every mode's and model's own options, each once, in catalog order
    (modes first); two different options of one name are a ValueError."""
    found: dict[str, Option] = {}
    entries: list[Model | Mode] = [*MODES.values(), *MODEL_SPECS.values()]
    for entry in entries:
        for option in entry.options:
            if found.setdefault(option.key, option) != option:
                raise ValueError(
                    f"{entry.name}: option --{option.name} is declared differently "
                    "by another model or mode; declare it once and share it"
                )
    return tuple(found.values())


def option_defaults() -> dict[str, Any]:
    """``Config.options`` when no flag is given."""
    return {option.key: option.default for option in options()}


def check_job(
    mode_name: str,
    model_name: str,
    argv: Sequence[str],
    *,
    batch_size: int,
    workers: Sequence[str],
    ps: Sequence[str],
) -> list[str]:
    """The launcher's checks of a job of the built-in trainer before any
    task starts (the mode's ``check_job``, given the trainer flags ``argv``
    and the nodes of roles.worker and roles.ps): lines to show about it;
    ValueError (one line) for what the trainer would refuse."""
    entry = mode(mode_name)
    if entry.check_job is None:
        return []
    facts = JobFacts(
        model=model_name,
        options=values_from_argv(options(), argv),
        batch_size=batch_size,
        workers=tuple(workers),
        ps=tuple(ps),
    )
    return entry.check_job(facts)
