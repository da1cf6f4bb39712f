"""Reports of many experiments: a sweep's trials, an ensemble's members.

``deploy.py report SWEEP_FOLDER`` reads the folder's ``sweep.json`` (written
by ``infra/sweeps/run.py``): one row per trial (its parameters, time, final
metrics), the best trial by one metric, and a plot of that metric against
each parameter. An ensemble run's summary (``--mode ensemble``) holds its
members' test results beside its own: ``ensemble_text`` says what the
ensemble gained over its best member. Nothing here prints; whatever comes
from the files is data the CLI shows as plain text.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.reports.compare import ReportError, literal_text
from infra.sweeps.trial import SWEEP_FILE, numbers
from infra.text import node_text

# Metrics to rank by, in order of preference, when none is asked for.
PREFERRED = ("test_accuracy", "psnr_reconstructed", "score", "accuracy")
# Parameters plotted, at most (a panel each).
MAX_PANELS = 8
# Words in a metric's name that make smaller better.
_LOWER_BETTER = ("loss", "error", "seconds", "time", "perplexity", "mse")


@dataclass(frozen=True)
class TrialRow:
    trial: int
    name: str
    params: dict[str, str]
    state: str
    node: str
    seconds: float | None
    metrics: dict[str, float]
    best: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SweepReport:
    path: Path
    sweep_id: str
    params: list[str]
    rows: list[TrialRow]
    metric: str | None
    higher_is_better: bool

    @property
    def best(self) -> TrialRow | None:
        return next((r for r in self.rows if r.best), None)


def is_sweep(path: str | Path) -> bool:
    return (Path(path) / SWEEP_FILE).is_file()


def higher_is_better(metric: str) -> bool:
    return not any(word in metric.lower() for word in _LOWER_BETTER)


def _text(value: Any, limit: int = 200) -> str:
    """A field of sweep.json as plain text (no terminal controls)."""
    return node_text(str(value))[:limit] if isinstance(value, str | int | float) else "?"


def _float(value: Any) -> float | None:
    """A number of sweep.json as a float; None for anything else (an
    integer past float's range too)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def load_sweep(path: str | Path, metric: str | None = None) -> SweepReport:
    """The sweep folder's trials, the best one marked (by ``metric``, else
    the first of PREFERRED that the finished trials have)."""
    folder = Path(path)
    file = folder / SWEEP_FILE
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        # ValueError: JSONDecodeError, or an integer of more digits than
        # Python converts; RecursionError: arrays nested thousands deep.
        raise ReportError(f"{file}: not readable JSON ({str(e)[:120]})") from None
    trials = data.get("trials") if isinstance(data, dict) else None
    if not isinstance(trials, list) or not all(isinstance(t, dict) for t in trials):
        raise ReportError(f"{file}: no list of trials")
    rows = []
    for t in trials:
        params = t.get("params") if isinstance(t.get("params"), dict) else {}
        seconds = t.get("seconds")
        index = t.get("trial")
        rows.append(
            TrialRow(
                trial=index if isinstance(index, int) else -1,
                name=_text(t.get("name", "")),
                params={_text(k, 60): _text(v) for k, v in params.items()},
                state=_text(t.get("state", "?"), 40),
                node=_text(t.get("node") or "-", 80),
                seconds=_float(seconds),
                metrics=numbers(t.get("metrics") or {}),
            )
        )
    names = list(data.get("params") or {}) if isinstance(data.get("params"), dict) else []
    names = [_text(n, 60) for n in names] or sorted({k for r in rows for k in r.params})
    done = [r for r in rows if r.state == "done"]
    if metric is None:
        seen = [m for r in done for m in r.metrics]
        metric = next((m for m in PREFERRED if m in seen), seen[0] if seen else None)
    elif not any(metric in r.metrics for r in done):
        have = sorted({m for r in done for m in r.metrics})
        raise ReportError(
            f"--metric {metric[:60]}: no finished trial has it; "
            + (f"they have {', '.join(have)}" if have else "no finished trial has metrics")
        )
    higher = higher_is_better(metric) if metric else True
    ranked = [r for r in done if metric and math.isfinite(r.metrics.get(metric, math.nan))]
    best = None
    if ranked and metric:
        best = (max if higher else min)(ranked, key=lambda r: r.metrics[metric])
    rows = [TrialRow(**{**r.__dict__, "best": r is best}) for r in rows]
    return SweepReport(
        path=folder,
        sweep_id=_text(data.get("sweep_id", folder.name), 80),
        params=names,
        rows=rows,
        metric=metric,
        higher_is_better=higher,
    )


def _as_numbers(values: list[str]) -> list[float] | None:
    try:
        out = [float(v) for v in values]
    except ValueError:
        return None
    return out if all(math.isfinite(v) for v in out) else None


def write_sweep_plot(report: SweepReport, path: str | Path) -> Path:
    """A PNG: the metric against each parameter (one panel each), every
    finished trial a point, the best one a star. Numeric values on a
    number line (log scale when they span a factor of 10 or more), others
    as categories."""
    import matplotlib

    matplotlib.use("Agg")

    with literal_text():  # parameter and metric names drawn as written
        return _save_sweep_plot(report, Path(path))


def _save_sweep_plot(report: SweepReport, out: Path) -> Path:
    import matplotlib.pyplot as plt

    # A panel per parameter, the first MAX_PANELS: a sweep.json naming
    # hundreds made a figure of tens of thousands of pixels (half a minute
    # of CPU, or matplotlib's refusal of its size).
    names = (report.params or ["trial"])[:MAX_PANELS]
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    metric = report.metric
    done = [r for r in report.rows if r.state == "done" and metric and metric in r.metrics]
    for axis, name in zip(axes[0], names, strict=True):
        raw = [r.params.get(name, str(r.trial)) for r in done]
        values = _as_numbers(raw)
        if values is None:
            categories = list(dict.fromkeys(raw))
            xs = [float(categories.index(v)) for v in raw]
            axis.set_xticks(range(len(categories)), [c[:20] for c in categories])
        else:
            xs = values
            if xs and min(xs) > 0 and max(xs) / min(xs) >= 10:
                axis.set_xscale("log")
        ys = [r.metrics[metric] for r in done] if metric else []
        axis.scatter(xs, ys, color="tab:blue", label="trials")
        for x, y, r in zip(xs, ys, done, strict=True):
            if r.best:
                axis.scatter([x], [y], marker="*", s=250, color="tab:red", label="best", zorder=3)
        axis.set(xlabel=name, ylabel=metric or "-", title=f"{metric or 'no metric'} vs {name}")
        axis.grid(alpha=0.3)
        if done:
            axis.legend(fontsize="small")
    fig.suptitle(f"sweep {report.sweep_id}")
    fig.tight_layout()
    # Written beside, then renamed over: a report.png that is a symlink
    # (a sweep folder from elsewhere) is replaced, never written through
    # (it overwrote whatever file it pointed to).
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".png", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            fig.savefig(handle, dpi=100, format="png")
        os.chmod(tmp, 0o644)  # as a plain write would leave it (mkstemp: 0600)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return out


def ensemble_text(summary: dict[str, Any]) -> str | None:
    """What an ensemble run gained over its best member, or None for a run
    that is not an ensemble."""
    ensemble = summary.get("ensemble")
    if not isinstance(ensemble, dict) or not isinstance(ensemble.get("members"), list):
        return None
    members = [m for m in ensemble["members"] if isinstance(m, dict)]
    accuracy = _float(ensemble.get("test_accuracy"))
    scored = [(m, a) for m in members if (a := _float(m.get("test_accuracy"))) is not None]
    if accuracy is None or not scored:
        return None
    best = max(a for _, a in scored)
    each = ", ".join(
        f"{_text(m.get('task', '?'), 30)} {_text(m.get('model', '?'), 30)} {a:.4f}"
        for m, a in scored
    )
    return (
        f"ensemble of {len(members)}: test accuracy {accuracy:.4f}, best member "
        f"{best:.4f}: gain {accuracy - best:+.4f} (members: {each})"
    )
