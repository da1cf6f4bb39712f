"""The chief's progress protocol as read here: which lines are events, and
the one schema every reader relies on.

The trainer (``trainer/loop/progress.py``) and a user's program print
``@tfcluster {json}`` lines among their ordinary output. Whatever prints
them runs on a node and is not trusted: a line that merely mentions the
prefix (a program echoing its input), a field of the wrong type, NaN or a
number past float's range, a nested object where a number belongs, must
never reach a reader as an event. So an event is a line that *starts* with
the prefix, whose JSON object names a known kind and whose fields each have
their kind's type (``SCHEMAS``); anything else is the program's text.

Every reader takes events from ``parse_line``: the live view and ``logs``
(``tfcluster_cli/progress_view.py``), sweeps' metrics
(``infra/sweeps/trial.py``), the job's result (``Job.follow``). Fields a
kind does not name are dropped, so no reader meets an unchecked value, and
strings arrive without terminal controls (``node_text``) and cut short.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from infra.text import node_text

PREFIX = "@tfcluster "

# Bounds of what a field may hold: a count past this is no step count, a
# number past this no metric (and 10**400, valid JSON, is past float).
MAX_COUNT = 10**15
MAX_NUMBER = 1e300
MAX_METRICS = 100


class Malformed(ValueError):
    """A protocol line whose field does not have its kind's type."""


@dataclass(frozen=True)
class ProgressEvent:
    """One event from the chief: start, progress, phase, checkpoint, done,
    error, startup, eval, or a program's own metrics."""

    kind: str
    data: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


# -- field types: each returns the value as readers get it, or raises -----------------

Check = Callable[[Any], Any]


def count(value: Any) -> int:
    """A step or task count: an integer (not a bool), 0 to MAX_COUNT."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
        raise Malformed("not a count")
    return value


def number(value: Any) -> int | float:
    """A finite number (not a bool) of magnitude at most MAX_NUMBER."""
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not (isinstance(value, int) or math.isfinite(value))
        or abs(value) > MAX_NUMBER
    ):
        raise Malformed("not a finite number")
    return value


def text(limit: int) -> Check:
    """A string, without terminal controls, cut to ``limit`` characters."""

    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise Malformed("not a string")
        return node_text(value)[:limit]

    return check


NAME = text(200)
LONG = text(2000)
METRIC_NAME = text(40)


def metrics(value: Any) -> dict[str, int | float | None]:
    """Named numbers (a number that was not finite travels as null)."""
    if not isinstance(value, Mapping) or len(value) > MAX_METRICS:
        raise Malformed("metrics are not an object of at most 100 numbers")
    return {METRIC_NAME(k): None if v is None else number(v) for k, v in value.items()}


def fields(schema: Mapping[str, Check], *, keep_others: bool = False) -> Check:
    """An object whose fields named in ``schema`` have their type (or are
    null); other fields are dropped, or kept as they are (``keep_others``:
    a run's summary, whose every field reaches ``JobResult.summary``)."""

    def check(value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise Malformed("not an object")
        out = dict(value) if keep_others else {}
        for key, kind in schema.items():
            if key in value:
                out[key] = None if value[key] is None else kind(value[key])
        return out

    return check


# The fields of a run's summary that readers interpret (the trainer's
# summary.json has more; they are kept, as data).
SUMMARY = fields(
    {
        "model": NAME,
        "mode": NAME,
        "workers": count,
        "ps": count,
        "steps": count,
        "total_steps": count,
        "training_seconds": number,
        "examples_per_sec": number,
        "test_accuracy": number,
        "test_loss": number,
        "final_loss": number,
        "psnr_corrupted": number,
        "psnr_reconstructed": number,
    },
    keep_others=True,
)

# One schema per event kind; a kind not here is not an event.
SCHEMAS: dict[str, Check] = {
    "start": fields(
        {
            "model": NAME,
            "mode": NAME,
            "total_steps": count,
            "workers": count,
            "ps": count,
            "output_dir": LONG,
            "resumed_from_step": count,
        }
    ),
    "progress": fields(
        {
            "step": count,
            "total_steps": count,
            "loss": number,
            "metrics": metrics,
            "examples_per_sec": number,
            "steps_per_sec": number,
            "elapsed": number,
            "eta": number,
        }
    ),
    "phase": fields({"name": NAME}),
    "checkpoint": fields({"step": count, "path": LONG}),
    "done": fields({"summary": SUMMARY}),
    "error": fields({"message": LONG}),
    "startup": fields({"stage": NAME, "seconds": number, "total": number}),
    # A test-set evaluation during training (the trainer's --eval-every).
    "eval": fields(
        {
            "step": count,
            "epoch": number,
            "train_s": number,
            "elapsed": number,
            "eval_s": number,
            "test_accuracy": number,
            "test_loss": number,
            "psnr_corrupted": number,
            "psnr_reconstructed": number,
        }
    ),
    "metrics": metrics,  # a program's own: every field a number
}


def parse_line(line: str) -> ProgressEvent | None:
    """The event on ``line``, or None for the program's own text: a line
    not starting with the prefix, JSON that does not parse, an unknown
    kind, or a field of the wrong type. Never raises for what a node
    prints."""
    if not line.startswith(PREFIX):
        return None
    try:
        data = json.loads(line[len(PREFIX) :])
    except (ValueError, RecursionError):
        # ValueError: malformed JSON, or an integer of more digits than
        # Python converts; RecursionError: arrays nested thousands deep.
        return None
    if not isinstance(data, dict):
        return None
    kind = data.pop("event", None)
    schema = SCHEMAS.get(kind) if isinstance(kind, str) else None
    if schema is None:
        return None
    try:
        return ProgressEvent(kind=kind, data=schema(data))
    except Malformed:
        return None
