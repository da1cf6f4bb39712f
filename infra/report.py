"""Training time compared: ``deploy.py report RUN_DIR...``.

Reads each run folder's ``summary.json`` (and ``metrics.jsonl`` for the
time line), computes one row per run, with the speedup over the 1-worker run
of the same model, and plots speedup against workers and the metric against
training time. The CLI renders the rows; nothing here prints.

Speedup is a ratio of training throughput (examples per second over the
whole training, compiling included), which is the time ratio for the same
amount of data whatever the mode: an async step uses one worker's batch, a
sync or average step one batch per worker. The 1-worker baseline of a model
is, in order of preference, a 1-worker run of the same mode, a ``single``
run, any 1-worker run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer import catalog

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
REQUIRED = ("model", "mode", "workers", "steps", "training_seconds", "examples_per_sec")
# Held-out results, by preference, and the training metric of the same kind:
# each model's, as the catalog names them.
FINAL_METRICS = tuple((key, name) for name, key, _ in catalog.final_metrics())


class ReportError(ValueError):
    """A run folder whose summary.json is missing or unreadable; the message
    names the file."""


@dataclass(frozen=True)
class Run:
    path: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Row:
    """One run in the comparison table."""

    run: str  # the run folder's name
    path: Path
    model: str
    mode: str
    workers: int
    ps: int
    steps: int
    training_seconds: float
    examples_per_sec: float
    speedup: float | None  # vs the model's 1-worker run; None without one
    metric: str | None  # "test_accuracy" or "psnr_reconstructed"
    value: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "path": str(self.path),
            "model": self.model,
            "mode": self.mode,
            "workers": self.workers,
            "ps": self.ps,
            "steps": self.steps,
            "training_seconds": self.training_seconds,
            "examples_per_sec": self.examples_per_sec,
            "speedup": self.speedup,
            "metric": self.metric,
            "value": self.value,
        }


def load_run(path: str | Path) -> Run:
    folder = Path(path)
    summary_path = folder / SUMMARY_FILE
    if not folder.is_dir():
        raise ReportError(f"{folder}: no such run folder")
    try:
        summary = json.loads(summary_path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{summary_path}: missing (did the run finish?)") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        # ValueError: JSONDecodeError, or an integer of more digits than
        # Python converts; RecursionError: arrays nested thousands deep.
        raise ReportError(f"{summary_path}: not readable JSON ({str(e)[:120]})") from None
    if not isinstance(summary, dict):
        raise ReportError(f"{summary_path}: not a JSON object")
    missing = [key for key in REQUIRED if key not in summary]
    if missing:
        raise ReportError(f"{summary_path}: missing {', '.join(missing)}")
    return Run(path=folder, summary=summary, metrics=_read_metrics(folder / METRICS_FILE))


def load_runs(paths: Iterable[str | Path]) -> list[Run]:
    return [load_run(p) for p in paths]


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's lines; a torn or foreign line is skipped (the file
    is only used for the plot, and a run killed mid-write still plots)."""
    if not path.exists():
        return []
    lines = []
    for text in path.read_text(errors="replace").splitlines():
        try:
            line = json.loads(text)
        except (ValueError, RecursionError):
            continue
        if isinstance(line, dict) and isinstance(line.get("elapsed"), int | float):
            lines.append(line)
    return lines


def _final_metric(summary: dict[str, Any]) -> tuple[str | None, float | None]:
    for name, _ in FINAL_METRICS:
        if isinstance(summary.get(name), int | float):
            return name, float(summary[name])
    return None, None


def _baseline(run: Run, runs: Sequence[Run]) -> Run | None:
    model = run.summary["model"]
    singles = [r for r in runs if r.summary["model"] == model and r.summary["workers"] == 1]
    for prefer in (
        lambda r: r.summary["mode"] == run.summary["mode"],
        lambda r: r.summary["mode"] == "single",
        lambda r: True,
    ):
        found = [r for r in singles if prefer(r)]
        if found:
            return found[0]
    return None


def compute_rows(runs: Sequence[Run]) -> list[Row]:
    """One row per run, in the order given."""
    rows = []
    for run in runs:
        s = run.summary
        base = _baseline(run, runs)
        base_speed = float(base.summary["examples_per_sec"]) if base is not None else 0.0
        metric, value = _final_metric(s)
        rows.append(
            Row(
                run=run.path.name,
                path=run.path,
                model=str(s["model"]),
                mode=str(s["mode"]),
                workers=int(s["workers"]),
                ps=int(s.get("ps", 0)),
                steps=int(s["steps"]),
                training_seconds=float(s["training_seconds"]),
                examples_per_sec=float(s["examples_per_sec"]),
                speedup=float(s["examples_per_sec"]) / base_speed if base_speed > 0 else None,
                metric=metric,
                value=value,
            )
        )
    return rows


def speedup_note(rows: Sequence[Row]) -> str | None:
    """Why some runs have no speedup, or None when each has one: a speedup
    is against a 1-worker run of the same model, among the runs given."""
    missing = sorted({row.model for row in rows if row.speedup is None})
    if not missing:
        return None
    return (
        f"no speedup for {', '.join(missing)}: it needs a 1-worker run of the same model "
        "among the runs compared (e.g. `deploy.py train --mode single`)"
    )


def write_plot(rows_or_runs: Sequence[Row] | Sequence[Run], path: str | Path) -> Path:
    """A PNG: speedup against workers (one line per model and mode, with the
    ideal linear speedup), and each training metric against training time."""
    import matplotlib.pyplot as plt

    fig = plot_figure(rows_or_runs)
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_figure(rows_or_runs: Sequence[Row] | Sequence[Run]) -> Any:
    """The matplotlib Figure that ``write_plot`` saves (close it after use)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [load_run(r.path) if isinstance(r, Row) else r for r in rows_or_runs]
    rows = compute_rows(runs)
    kinds = [kind for _, kind in FINAL_METRICS if any(kind in m for r in runs for m in r.metrics)]
    fig, axes = plt.subplots(1, 1 + len(kinds), figsize=(5.5 * (1 + len(kinds)), 4), squeeze=False)
    speed = axes[0][0]
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for row in rows:
        if row.speedup is not None:
            series.setdefault((row.model, row.mode), []).append((row.workers, row.speedup))
    most = max([row.workers for row in rows] + [1])
    speed.plot([1, most], [1, most], linestyle=":", color="gray", label="linear")
    for (model, mode), points in sorted(series.items()):
        # Every speedup is relative to a 1-worker run: each line starts there.
        points = sorted(set(points) | {(1, 1.0)} if all(w != 1 for w, _ in points) else points)
        speed.plot(
            [p[0] for p in points], [p[1] for p in points], marker="o", label=f"{model} {mode}"
        )
    if not series:
        # An empty panel would look like a failed plot: say why it is empty.
        speed.text(
            0.5,
            0.5,
            "no speedup to plot:\nit needs a 1-worker run\nof the same model among the runs",
            ha="center",
            va="center",
            transform=speed.transAxes,
            color="dimgray",
        )
    speed.set(xlabel="workers", ylabel="speedup (examples/s vs 1 worker)", title="Speedup")
    speed.xaxis.get_major_locator().set_params(integer=True)
    speed.legend(fontsize="small")
    for axis, kind in zip(axes[0][1:], kinds, strict=True):
        for run in runs:
            points = [
                (m["elapsed"], m[kind]) for m in run.metrics if isinstance(m.get(kind), int | float)
            ]
            if points:
                s = run.summary
                axis.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    marker=".",
                    label=f"{run.path.name}: {s['model']} {s['mode']} x{s['workers']}",
                )
        axis.set(xlabel="training seconds", ylabel=f"training {kind}", title=f"Time to {kind}")
        axis.legend(fontsize="small")
    for axis in axes[0]:
        axis.grid(alpha=0.3)
    fig.tight_layout()
    return fig
