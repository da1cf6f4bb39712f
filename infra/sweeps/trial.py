"""A trial of a sweep as it is recorded: ``Trial`` (one point of the grid
and what became of it, a row of the sweep folder's ``sweep.json``) and the
metrics a trial reports, read from its output lines as they come and from
its summary.json at its end.

Apart from the engine (infra/sweeps/run.py) because ``deploy.py report`` reads
the same records back (infra/reports/sweeps.py) without running anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infra.jobs.protocol import parse_line
from infra.text import node_text

SWEEP_FILE = "sweep.json"
# The metrics a built-in trainer's summary.json gives a trial.
TRAINER_METRICS = (
    "test_accuracy",
    "test_loss",
    "psnr_reconstructed",
    "final_loss",
    "training_seconds",
    "examples_per_sec",
)


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class Trial:
    """One point of the grid and what became of it. ``state``: queued,
    running, done (exit 0), failed (non-zero exit, killed, or its node lost
    twice) or stopped (Ctrl-C)."""

    index: int
    params: dict[str, str]
    state: str = "queued"
    node: str | None = None
    exit_code: int | None = None
    attempts: int = 0
    started: str | None = None
    ended: str | None = None
    seconds: float | None = None
    last_metric: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    note: str = ""
    lost_nodes: list[str] = field(default_factory=list)
    _t0: float = 0.0

    @property
    def name(self) -> str:
        """Its task name on the node (log and pid files) and its folder."""
        return f"trial-{self.index}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "trial": self.index,
            "name": self.name,
            "params": dict(self.params),
            "state": self.state,
            "node": self.node,
            "exit_code": self.exit_code,
            "attempts": self.attempts,
            "started": self.started,
            "ended": self.ended,
            "seconds": self.seconds,
            "metrics": dict(self.metrics or self.last_metric),
            "note": self.note,
            "lost_nodes": list(self.lost_nodes),
            "run_dir": self.name,
        }


def line_metrics(line: str) -> dict[str, float]:
    """The metrics a trial's output line reports: the trainer's progress
    events (loss and metrics), its final summary, or a program's own
    ``@tfcluster {"event": "metrics", "accuracy": 0.9}``."""
    event = parse_line(line)
    if event is None:
        return {}
    if event.kind == "progress":
        data = dict(event.get("metrics") or {})
        if "loss" in event.data:
            data = {"loss": event.get("loss"), **data}
        return numbers(data)
    if event.kind == "done":
        return summary_metrics(event.get("summary") or {})
    if event.kind == "metrics":
        return numbers(event.data)
    return {}


def numbers(data: Mapping[str, Any]) -> dict[str, float]:
    """The numeric fields (names cleaned of terminal controls). An integer
    past float's range (valid JSON from a node or a file) is left out."""
    if not isinstance(data, Mapping):
        return {}
    out = {}
    for k, v in data.items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            try:
                out[node_text(str(k))[:40]] = float(v)
            except OverflowError:
                continue
    return out


def summary_metrics(summary: Mapping[str, Any]) -> dict[str, float]:
    """A run's final metrics from its summary: the built-in trainer's known
    ones, or every number of a program's own summary.json."""
    if "model" in summary and "mode" in summary:
        return numbers({k: summary[k] for k in TRAINER_METRICS if k in summary})
    return numbers(summary)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
