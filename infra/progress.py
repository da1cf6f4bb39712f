"""Parsing the chief's progress protocol.

The trainer prints one line per event, ``@tfcluster {json}``
(``trainer/progress.py`` writes them); everything else on its stdout is
ordinary log text. Parsing lives here, apart from the command that tails
the log, so it can be tested on recorded output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

PREFIX = "@tfcluster "


@dataclass(frozen=True)
class ProgressEvent:
    """One event from the chief: start, progress, phase, checkpoint, done, error."""

    kind: str
    data: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


def parse_line(line: str) -> ProgressEvent | None:
    """The event on ``line``, or None for ordinary log text (and for a
    malformed event, which must never stop a training run from being shown)."""
    start = line.find(PREFIX)
    if start < 0:
        return None
    try:
        data = json.loads(line[start + len(PREFIX) :])
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("event"), str):
        return None
    return ProgressEvent(kind=data.pop("event"), data=data)


def describe(event: ProgressEvent) -> str:
    """A short human line for an event (used by logs and non-TTY output)."""
    if event.kind == "progress":
        step, total = event.get("step", 0), event.get("total_steps", 0)
        metrics = event.get("metrics") or {}
        shown = " ".join(f"{k} {v:.4g}" for k, v in metrics.items() if isinstance(v, int | float))
        eta = event.get("eta")
        eta_text = f" eta {format_seconds(eta)}" if isinstance(eta, int | float) else ""
        return (
            f"step {step}/{total} loss {event.get('loss', float('nan')):.4f} {shown} "
            f"{event.get('examples_per_sec', 0):.0f} ex/s{eta_text}"
        ).replace("  ", " ")
    if event.kind == "start":
        return (
            f"training {event.get('model')} ({event.get('mode')}) for "
            f"{event.get('total_steps')} steps on {event.get('workers')} worker(s), "
            f"{event.get('ps')} ps"
            + (
                f", resumed from step {event.get('resumed_from_step')}"
                if event.get("resumed_from_step")
                else ""
            )
        )
    if event.kind == "phase":
        return f"phase {event.get('name')}"
    if event.kind == "checkpoint":
        return f"checkpoint at step {event.get('step')}"
    if event.kind == "done":
        return "done: " + summary_text(event.get("summary") or {})
    if event.kind == "error":
        return f"error: {event.get('message')}"
    return f"{event.kind}: {json.dumps(event.data)}"


def summary_text(summary: dict[str, Any]) -> str:
    parts = [
        f"{summary.get('steps')} steps in {summary.get('training_seconds', 0):.1f} s",
        f"{summary.get('examples_per_sec', 0):.0f} examples/s",
    ]
    if summary.get("test_accuracy") is not None:
        parts.append(f"test accuracy {summary['test_accuracy']:.4f}")
    if summary.get("psnr_reconstructed") is not None:
        parts.append(
            f"PSNR {summary.get('psnr_corrupted', 0):.2f} dB corrupted -> "
            f"{summary['psnr_reconstructed']:.2f} dB reconstructed"
        )
    return ", ".join(parts)


def format_seconds(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
