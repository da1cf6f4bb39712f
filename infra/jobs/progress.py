"""The chief's progress events, said: ``describe`` (a line for logs, the
live view and non-TTY output), ``summary_text``, and ``StartupClock`` (the
orchestrator's own start-up stages, as events).

Which lines are events, and the type of each field, is
``infra/jobs/protocol.py`` (``parse_line``, ``ProgressEvent``, re-exported
here); what it lets through is typed, and the formatting below still shows
a field it does not know rather than fail.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

from infra.jobs.protocol import PREFIX, ProgressEvent, parse_line
from infra.text import node_text
from trainer.loop.progress import STARTUP_ENV

__all__ = [
    "PREFIX",
    "STAGES",
    "ProgressEvent",
    "StartupClock",
    "describe",
    "format_seconds",
    "metrics_text",
    "number",
    "parse_line",
    "summary_text",
]

# What each start-up stage is called on screen (the trainer's and ours).
STAGES = {
    "command": "command ready",
    "sync": "code synced",
    "start_tasks": "tasks started",
    "ready": "ps and workers ready",
    "launch": "chief launched",
    "tensorflow": "TensorFlow imported",
    "build": "model and inputs built",
    "first_step": "first step",
}


class StartupClock:
    """The orchestrator's share of a job's start-up: each ``mark`` ends a
    stage and says it as a ``startup`` event, like the chief's own stages.
    ``for_chief`` is what the chief is told (``TFCLUSTER_STARTUP``), so its
    summary.json holds the whole start-up from the command on."""

    def __init__(
        self, on_event: Callable[[ProgressEvent], None], started: float | None = None
    ) -> None:
        self.on_event = on_event
        self.parts: dict[str, float] = {}
        self._last = time.monotonic()
        if started is not None:  # the command's process start (monotonic)
            self.parts["command"] = max(0.0, self._last - started)

    def mark(self, stage: str) -> None:
        now = time.monotonic()
        self.parts[stage] = self.parts.get(stage, 0.0) + max(0.0, now - self._last)
        self._last = now
        self.on_event(
            ProgressEvent("startup", {"stage": stage, "seconds": round(self.parts[stage], 3)})
        )

    def for_chief(self) -> dict[str, str]:
        """The chief's environment entry, made as its start is issued: the
        stages so far, ``start_tasks`` up to now, and the wall-clock time."""
        parts = dict(self.parts)
        parts["start_tasks"] = parts.get("start_tasks", 0.0) + time.monotonic() - self._last
        parts["issued"] = time.time()
        return {STARTUP_ENV: json.dumps(parts)}


def describe(event: ProgressEvent) -> str:
    """A short human line for an event (used by logs and non-TTY output).
    Its fields come from the chief's node: the line is plain text without
    terminal controls (print it with markup off), and a field of the wrong
    type is shown, never a crash."""
    return node_text(_describe(event))


def _describe(event: ProgressEvent) -> str:
    if event.kind == "progress":
        step, total = event.get("step", 0), event.get("total_steps", 0)
        shown = metrics_text(event.get("metrics"), ".4g")
        eta = event.get("eta")
        eta_text = f" eta {format_seconds(eta)}" if isinstance(eta, int | float) else ""
        return (
            f"step {step}/{total} loss {number(event.get('loss', float('nan')), '.4f')} {shown} "
            f"{number(event.get('examples_per_sec', 0), '.0f')} ex/s{eta_text}"
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
    if event.kind == "startup":
        stage = event.get("stage")
        label = STAGES.get(stage, stage) if isinstance(stage, str) else stage
        text = f"startup: {label} {number(event.get('seconds'), '.1f')} s"
        if event.get("total") is not None:
            text += f", {number(event.get('total'), '.1f')} s from the command"
        return text
    if event.kind == "eval":
        scores = {k: event.get(k) for k in ("test_accuracy", "test_loss", "psnr_reconstructed")}
        return (
            f"eval at step {event.get('step')} (epoch {number(event.get('epoch'), '.2f')}, "
            f"{number(event.get('train_s'), '.0f')} s of training): "
            + metrics_text({k: v for k, v in scores.items() if v is not None}, ".4f")
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
    """One line for a run's summary (the chief's, or its summary.json):
    plain text without terminal controls; print it with markup off."""
    if not isinstance(summary, dict):
        summary = {}
    parts = [
        f"{summary.get('steps')} steps in {number(summary.get('training_seconds', 0), '.1f')} s",
        f"{number(summary.get('examples_per_sec', 0), '.0f')} examples/s",
    ]
    if summary.get("test_accuracy") is not None:
        parts.append(f"test accuracy {number(summary['test_accuracy'], '.4f')}")
    if summary.get("psnr_reconstructed") is not None:
        parts.append(
            f"PSNR {number(summary.get('psnr_corrupted', 0), '.2f')} dB corrupted -> "
            f"{number(summary['psnr_reconstructed'], '.2f')} dB reconstructed"
        )
    return node_text(", ".join(parts))


def metrics_text(metrics: Any, spec: str) -> str:
    """``name value`` pairs of an event's numeric metrics (names cleaned)."""
    if not isinstance(metrics, dict):
        return ""
    return " ".join(
        f"{node_text(str(k))} {number(v, spec)}"
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    )


def number(value: Any, spec: str) -> str:
    """``value`` formatted with ``spec`` if it is a number, else as text: a
    field of the wrong type from a node is shown, never a crash."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return format(value, spec)
        except (OverflowError, ValueError):  # an int past float's range
            return "?"
    return node_text(str(value))


def format_seconds(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds > 1e9:  # NaN, Infinity, nonsense
        return "?"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
