"""A model's or a mode's own command-line options: declared with its entry
in ``trainer/catalog.py``, offered by ``trainer/flags.py`` to ``python -m
trainer``, read back from ``Config.options`` by the model or mode. Plain
Python, like the catalog: the launcher reads both.

A new model with options of its own declares them here-shaped in its
catalog entry; flags.py needs no change."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
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
