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

A summary.json comes from a node (or anyone): a field that is not a number
is shown as text (``"two"`` workers), never a crash, and a name with ``$``
in it is drawn as it is written, never as matplotlib's mathtext or LaTeX
(``literal_text``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.text import node_text
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
    # Each a number, or the summary's value as text where it is not one.
    workers: int | str
    ps: int | str
    steps: int | str
    training_seconds: float | str
    examples_per_sec: float | str
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


def as_float(value: Any) -> float | None:
    """A number of a summary as a float; None for anything else (a bool, a
    string, an integer past float's range)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def _text(value: Any) -> str:
    """A summary's value shown as text (no terminal control, cut short)."""
    return node_text(str(value))[:60]


def _count(value: Any) -> int | str:
    return value if isinstance(value, int) and not isinstance(value, bool) else _text(value)


def _real(value: Any) -> float | str:
    number = as_float(value)
    return number if number is not None else _text(value)


def _final_metric(summary: dict[str, Any]) -> tuple[str | None, float | None]:
    for name, _ in FINAL_METRICS:
        if (value := as_float(summary.get(name))) is not None:
            return name, value
    return None, None


def _baseline(row: Row, rows: Sequence[Row]) -> Row | None:
    singles = [r for r in rows if r.model == row.model and r.workers == 1]
    for prefer in (
        lambda r: r.mode == row.mode,
        lambda r: catalog.one_process(r.mode),
        lambda r: True,
    ):
        found = [r for r in singles if prefer(r)]
        if found:
            return found[0]
    return None


def _row(run: Run) -> Row:
    s = run.summary
    metric, value = _final_metric(s)
    return Row(
        run=run.path.name,
        path=run.path,
        model=_text(s["model"]),
        mode=_text(s["mode"]),
        workers=_count(s["workers"]),
        ps=_count(s.get("ps", 0)),
        steps=_count(s["steps"]),
        training_seconds=_real(s["training_seconds"]),
        examples_per_sec=_real(s["examples_per_sec"]),
        speedup=None,
        metric=metric,
        value=value,
    )


def compute_rows(runs: Sequence[Run]) -> list[Row]:
    """One row per run, in the order given."""
    rows = [_row(run) for run in runs]
    out = []
    for row in rows:
        base = _baseline(row, rows)
        speed, base_speed = row.examples_per_sec, base.examples_per_sec if base else None
        speedup = None
        if isinstance(speed, float) and isinstance(base_speed, float) and base_speed > 0:
            speedup = speed / base_speed
        out.append(dataclasses.replace(row, speedup=speedup))
    return out


@contextlib.contextmanager
def literal_text() -> Iterator[None]:
    """Within: every text matplotlib makes is drawn as written. Run, model,
    metric and parameter names come from files: ``$\\frac{$`` as mathtext
    (or anything through a user's ``text.usetex``) failed the whole report.
    Tick labels are made as the figure is drawn: save inside too."""
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
        yield


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

    with literal_text():
        fig = plot_figure(rows_or_runs)
        out = Path(path)
        try:
            fig.savefig(out, dpi=100)
        finally:
            plt.close(fig)
    return out


def plot_figure(rows_or_runs: Sequence[Row] | Sequence[Run]) -> Any:
    """The matplotlib Figure that ``write_plot`` saves (close it after use;
    make it and save it within ``literal_text``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [load_run(r.path) if isinstance(r, Row) else r for r in rows_or_runs]
    rows = compute_rows(runs)
    kinds = [kind for _, kind in FINAL_METRICS if any(kind in m for r in runs for m in r.metrics)]
    fig, axes = plt.subplots(1, 1 + len(kinds), figsize=(5.5 * (1 + len(kinds)), 4), squeeze=False)
    _plot_speedup(axes[0][0], rows)
    for axis, kind in zip(axes[0][1:], kinds, strict=True):
        _plot_curves(axis, kind, runs, rows)
    for axis in axes[0]:
        axis.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _plot_speedup(speed: Any, rows: Sequence[Row]) -> None:
    """The first panel: each model and mode's speedup by workers, against
    the linear one."""
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    counted = [row for row in rows if isinstance(row.workers, int)]
    for row in counted:
        if row.speedup is not None:
            series.setdefault((row.model, row.mode), []).append((int(row.workers), row.speedup))
    most = max([int(row.workers) for row in counted] + [1])
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


def _plot_curves(axis: Any, kind: str, runs: Sequence[Run], rows: Sequence[Row]) -> None:
    """A panel of a training metric (``kind``) by seconds, a line a run."""
    for run, row in zip(runs, rows, strict=True):
        curve = [
            (x, y)
            for m in run.metrics
            if (x := as_float(m["elapsed"])) is not None
            and (y := as_float(m.get(kind))) is not None
        ]
        if curve:
            axis.plot(
                [p[0] for p in curve],
                [p[1] for p in curve],
                marker=".",
                label=f"{row.run[:60]}: {row.model} {row.mode} x{row.workers}",
            )
    axis.set(xlabel="training seconds", ylabel=f"training {kind}", title=f"Time to {kind}")
    axis.legend(fontsize="small")
