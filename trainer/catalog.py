"""The built-in trainer's models and training modes, named once.

Plain Python, importable without TensorFlow: ``trainer/flags.py`` offers
these choices to ``python -m trainer``, and the launcher (cluster.yaml's
``job``, ``deploy.py train``'s choices, which tasks a job starts, which
held-out figure ``deploy.py report`` shows) reads them from here instead of
restating them.

Each entry names the module that implements it on the TensorFlow side
(imported only by the trainer, only when it trains):

* a model: ``Model(...)`` below and a module under ``trainer/models/`` with
  ``create_task(config) -> Task`` (``trainer/models/base.py``). Two files.
* a mode: ``Mode(...)`` below and a module under ``trainer/modes/`` with
  ``MODE``, a ``TrainingMode`` (``trainer/modes/base.py``). Two files; a
  third (``trainer/distribute.py``) only for a kind of strategy none of
  the modes uses yet.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    """A model: where its ``create_task`` is, and the facts flags and the
    report need before TensorFlow is imported."""

    name: str
    module: str
    # Adam step size that converges within a few hundred steps on MNIST.
    learning_rate: float
    # A classifier: an ensemble can average its class probabilities.
    classifier: bool = False
    # Its losses cast float16 outputs back to float32 (--mixed-precision).
    mixed_precision: bool = False
    # Its final held-out figure: (metrics.jsonl's training metric of the same
    # kind, summary.json key, label), or None.
    final_metric: tuple[str, str, str] | None = None


_ACCURACY = ("accuracy", "test_accuracy", "test accuracy")
_PSNR = ("psnr", "psnr_reconstructed", "test PSNR")

# The source material's CNN used 1e-4 for 20,000 steps; tfcluster's runs are short.
_MODELS = (
    Model("cnn", "trainer.models.classifier", 1e-3, True, True, _ACCURACY),
    Model("convnet", "trainer.models.classifier", 1e-3, True, True, _ACCURACY),
    Model("dae", "trainer.models.dae", 3e-3, final_metric=_PSNR),
    Model("sdae", "trainer.models.sdae", 3e-3, final_metric=_PSNR),
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
# (``trainer/distribute.py``'s ``create_strategy`` makes them).
PARAMETER_SERVER = "parameter_server"  # ParameterServerStrategy and a coordinator
COLLECTIVE = "collective"  # MultiWorkerMirroredStrategy
LOCAL = "local"  # MirroredStrategy over the local GPUs, else the default
STRATEGIES = (PARAMETER_SERVER, COLLECTIVE, LOCAL)


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

    @property
    def needs_ps(self) -> bool:
        return "ps" in self.task_types

    @property
    def needs_workers(self) -> bool:
        return "worker" in self.task_types


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
    ),
    Mode(
        "sync",
        ("chief", "worker"),
        "all-reduce of the gradients every step",
        "trainer.modes.sync",
        "all-reduce every step",
        COLLECTIVE,
    ),
    Mode(
        "average",
        ("chief", "worker"),
        "parameter averaging every --average-every steps",
        "trainer.modes.average",
        "parameter averaging every --average-every steps",
        COLLECTIVE,
    ),
    Mode(
        "single",
        ("chief",),
        "one process, every local device",
        "trainer.modes.single",
        "one process (default)",
        LOCAL,
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
    ),
)
MODES: dict[str, Mode] = {mode.name: mode for mode in _MODES}
MODE_NAMES = tuple(MODES)


def mode(name: str) -> Mode:
    """The mode called ``name``; ValueError naming the choices otherwise."""
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(
            f"unknown mode {name!r}; expected one of {', '.join(MODE_NAMES)}"
        ) from None
