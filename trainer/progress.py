"""The chief's progress protocol: one ``@tfcluster {json}`` line per event.

``infra/progress.py`` parses these lines out of the chief's log (everything
else on stdout is ordinary text), so the format is a contract: the prefix,
then a single-line JSON object whose first key is ``event``. Events: start,
progress, phase, checkpoint, done, error. Each line is flushed at once so the
orchestrator, which tails the log file, sees it while training goes on.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from typing import Any, TextIO

PREFIX = "@tfcluster "


def _finite(value: Any) -> Any:
    """JSON has no NaN/Infinity: strict parsers reject Python's spelling of
    them, so non-finite floats travel as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def format_event(event: str, fields: Mapping[str, Any]) -> str:
    """The protocol line for one event (without the newline)."""
    payload = {"event": event, **_finite(dict(fields))}
    return PREFIX + json.dumps(payload, separators=(",", ":"), allow_nan=False)


class Progress:
    """Writes protocol lines to ``stream``; silent where ``enabled`` is False
    (every task but the chief), so callers never need to ask who they are."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True) -> None:
        self._stream = stream
        self.enabled = enabled

    def emit(self, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        stream = self._stream or sys.stdout
        stream.write(format_event(event, fields) + "\n")
        stream.flush()

    def start(
        self,
        *,
        model: str,
        mode: str,
        total_steps: int,
        workers: int,
        ps: int,
        output_dir: str,
        resumed_from_step: int,
    ) -> None:
        self.emit(
            "start",
            model=model,
            mode=mode,
            total_steps=total_steps,
            workers=workers,
            ps=ps,
            output_dir=output_dir,
            resumed_from_step=resumed_from_step,
        )

    def progress(
        self,
        *,
        step: int,
        total_steps: int,
        loss: float,
        metrics: Mapping[str, float],
        examples_per_sec: float,
        steps_per_sec: float,
        elapsed: float,
        eta: float,
    ) -> None:
        self.emit(
            "progress",
            step=step,
            total_steps=total_steps,
            loss=loss,
            metrics=dict(metrics),
            examples_per_sec=examples_per_sec,
            steps_per_sec=steps_per_sec,
            elapsed=elapsed,
            eta=eta,
        )

    def phase(self, name: str) -> None:
        self.emit("phase", name=name)

    def checkpoint(self, step: int, path: str) -> None:
        self.emit("checkpoint", step=step, path=path)

    def done(self, summary: Mapping[str, Any]) -> None:
        self.emit("done", summary=dict(summary))

    def error(self, message: str) -> None:
        self.emit("error", message=message)
