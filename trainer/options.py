"""A model's or a mode's own command-line options: declared with its entry
in ``trainer/catalog.py``, offered by ``trainer/flags.py`` to ``python -m
trainer``, read back from ``Config.options`` by the model or mode. Plain
Python, like the catalog: the launcher reads both.

A new model with options of its own declares them here-shaped in its
catalog entry; flags.py needs no change."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# An error message, or None: what a model's checks of its options return.
Check = Callable[[Mapping[str, Any]], str | None]
# The same for the model that trains, given the run's steps (None: --epochs).
RunCheck = Callable[[Mapping[str, Any], int | None], str | None]


@dataclass(frozen=True)
class Option:
    """``--name``: its value made by ``type`` from the text (argparse's
    ``type``: an ``argparse.ArgumentTypeError`` says what is wrong), or, as a
    ``switch``, ``--name``/``--no-name``. ``Config.options[key]`` holds it."""

    name: str
    type: Callable[[str], Any] = str
    default: Any = None
    help: str | None = None
    choices: tuple[str, ...] | None = None
    # The section of ``--help`` it is listed in (None: with the general flags).
    group: str | None = None
    switch: bool = False

    @property
    def key(self) -> str:
        return self.name.replace("-", "_")

    @property
    def flag(self) -> str:
        return "--" + self.name


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


# argparse names a type in its error for text the type cannot read at all
# ("invalid _positive_int value: 'x'"): the names these had in flags.py, so
# that message stays what it was.
for _type in (positive_int, non_negative_int, positive_float):
    _type.__name__ = "_" + _type.__name__


@dataclass(frozen=True)
class JobFacts:
    """What the launcher knows of a job of the built-in trainer before any
    task starts: a mode's ``check_job`` (``trainer/catalog.py``) reads it."""

    model: str
    # Every model's and mode's option (``Option.key``): the job's flags, else defaults.
    options: Mapping[str, Any]
    batch_size: int
    workers: tuple[str, ...]  # nodes of the job's worker tasks
    ps: tuple[str, ...]  # nodes of cluster.yaml's roles.ps


# Lines to show about the job, or ValueError (one line) for a job the
# trainer would refuse: a mode's checks before any task starts.
JobCheck = Callable[[JobFacts], list[str]]


def values_from_argv(options: Sequence[Option], argv: Sequence[str]) -> dict[str, Any]:
    """``options``' values (by key) as the trainer would parse them from
    ``argv`` (``--name value``, ``--name=value``, ``--[no-]switch``),
    defaults for those not given; any other argument is left alone.
    ValueError naming the flag for a value its type or choices refuse."""
    values = {option.key: option.default for option in options}
    flags = {option.flag: option for option in options}
    switches = {"--no-" + o.name: o for o in options if o.switch}
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--":
            break
        name, equals, text = arg.partition("=")
        if name in switches and not equals:
            values[switches[name].key] = False
            continue
        option = flags.get(name)
        if option is None:
            continue
        if option.switch:
            values[option.key] = True
            continue
        if not equals:
            if i + 1 >= len(args):
                raise ValueError(f"{name}: expected a value")
            text = args[i + 1]
        try:
            value = option.type(text)
        except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
            raise ValueError(f"{name} {text}: {e}") from None
        if option.choices is not None and value not in option.choices:
            raise ValueError(f"{name} {text}: choose one of {', '.join(option.choices)}")
        values[option.key] = value
    return values
