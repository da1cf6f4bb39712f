"""``report`` of a ``--mode layers`` run: which device holds which
variables (as the trainer read them from the variables themselves), and
how much of each step the pipeline's stages waited.

summary.json comes from a node: every field is checked for its type and
anything else is left out, never trusted (the CLI prints the names as
text)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DevicePlacement:
    """One device of a run and the model variables on it."""

    device: str
    variables: tuple[str, ...]
    bytes: int | None  # their parameter bytes (params_per_device)

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device, "variables": list(self.variables), "bytes": self.bytes}


def placement_rows(summary: Mapping[str, Any]) -> list[DevicePlacement]:
    """Each device of the run's ``placement`` (variable path -> device),
    with its variables and bytes, in device order; [] for a run without."""
    placement = summary.get("placement")
    if not isinstance(placement, dict):
        return []
    sizes = summary.get("params_per_device")
    sizes = sizes if isinstance(sizes, dict) else {}
    held: dict[str, list[str]] = {}
    for path, device in placement.items():
        if isinstance(path, str) and isinstance(device, str):
            held.setdefault(device, []).append(path)
    return [
        DevicePlacement(device, tuple(sorted(paths)), _bytes(sizes.get(device)))
        for device, paths in sorted(held.items())
    ]


def pipeline_text(summary: Mapping[str, Any]) -> str | None:
    """The pipeline in a line: stages, micro-batches, the measured bubble
    against GPipe's for equal stages, each stage's compute seconds."""
    stages = summary.get("stages")
    bubble = _number(summary.get("bubble"))
    if not isinstance(stages, list) or bubble is None:
        return None
    pieces = _int(summary.get("micro_batches")) or 1
    text = f"{len(stages)} stages, {pieces} micro-batch(es): "
    text += f"stages waited {bubble:.0%} of each step"
    if (ideal := _number(summary.get("gpipe_bubble"))) is not None:
        text += f" (GPipe's bubble for equal stages: {ideal:.0%})"
    seconds = summary.get("stage_seconds")
    if isinstance(seconds, list) and all(_number(s) is not None for s in seconds):
        text += "; compute seconds per stage: " + ", ".join(f"{s:.1f}" for s in seconds)
    return text


def _bytes(value: Any) -> int | None:
    """A byte count: a whole number a float holds (10**400 is none: its MB
    raised OverflowError)."""
    found = _int(value)
    return found if found is not None and 0 <= found < 2**63 else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer past float's range
        return None
