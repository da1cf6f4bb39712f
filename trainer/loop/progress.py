"""The chief's progress protocol: one ``@tfcluster {json}`` line per event.

``infra/jobs/progress.py`` parses these lines out of the chief's log (everything
else on stdout is ordinary text), so the format is a contract: the prefix,
then a single-line JSON object whose first key is ``event``. Events: start,
progress, phase, checkpoint, done, error, startup (one per stage of the
start, ``Startup``), eval (a test-set evaluation during training). Each
line is flushed at once so the orchestrator, which tails the log file,
sees it while training goes on.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

PREFIX = "@tfcluster "
# What the orchestrator tells the chief about the start-up before it:
# {"command": s, "sync": s, "start_tasks": s, "ready": s (where it waited
# for the other tasks before starting the chief), "issued": unix time at
# which the chief's start was issued}.
STARTUP_ENV = "TFCLUSTER_STARTUP"


def process_age() -> float:
    """Seconds since this process started (interpreter start-up and
    imports included), from /proc; 0.0 where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime, in clock ticks since boot
        started = ticks / os.sysconf("SC_CLK_TCK")
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


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

    def startup(self, stage: str, seconds: float, total: float | None = None) -> None:
        extra = {} if total is None else {"total": round(total, 3)}
        self.emit("startup", stage=stage, seconds=round(seconds, 3), **extra)


class Startup:
    """The chief's start-up, stage by stage: each ``mark`` ends a stage,
    says it on the protocol and keeps its duration for summary.json.

    The first stages come from the orchestrator (``TFCLUSTER_STARTUP``):
    ``command`` (deploy.py's own start: imports, config, checks), ``sync``,
    ``start_tasks`` and, where the chief started only once the other tasks
    listened, ``ready``. Then ``launch`` (from the chief's start being
    issued to this process starting: a remote shell's latency; wall clocks
    of two machines, so clamped at 0), and this process's own stages from
    its start: ``tensorflow`` (imported), ``ready`` (an async chief started
    with its ps and workers: until they listen),
    ``build`` (strategy, model, inputs), ``first_step``. Their sum,
    ``total``, is the time from the command to the first step."""

    def __init__(self, progress: Progress, before: str | None = None) -> None:
        self.progress = progress
        self.parts: dict[str, float] = {}
        self._last = time.monotonic() - process_age()
        try:
            given = json.loads(before) if before else {}
        except json.JSONDecodeError:
            given = {}
        if not isinstance(given, dict):
            given = {}
        for name in ("command", "sync", "start_tasks", "ready"):
            value = given.get(name)
            if isinstance(value, int | float) and math.isfinite(value) and value >= 0:
                self.parts[name] = float(value)
        issued = given.get("issued")
        if isinstance(issued, int | float) and math.isfinite(issued):
            began = time.time() - (time.monotonic() - self._last)
            self.parts["launch"] = min(max(0.0, began - issued), 600.0)
        self.done = False

    @classmethod
    def from_env(cls, progress: Progress) -> Startup:
        return cls(progress, os.environ.get(STARTUP_ENV))

    def mark(self, stage: str, *, last: bool = False) -> None:
        """The stage ``stage`` ends now (``last``: and the start-up)."""
        if self.done:
            return
        now = time.monotonic()
        self.parts[stage] = max(0.0, now - self._last)
        self._last = now
        total = sum(self.parts.values()) if last else None
        self.progress.startup(stage, self.parts[stage], total)
        self.done = last

    def first_step(self) -> None:
        """The first step's result is in: the start-up is over."""
        self.mark("first_step", last=True)

    def summary(self) -> dict[str, float]:
        """``startup_s`` of summary.json: every stage's seconds and ``total``."""
        parts = {k: round(v, 3) for k, v in self.parts.items()}
        return {**parts, "total": round(sum(self.parts.values()), 3)}
