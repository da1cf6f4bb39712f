"""What the chief leaves in the run folder, and its progress events.

``RunLog`` is the single place a log interval is recorded: a progress event
on stdout, a line of ``metrics.jsonl`` and TensorBoard scalars. Every other
task gets a disabled ``RunLog`` and writes nothing. ``write_summary`` and the
plots finish the folder: ``summary.json``, ``loss.png`` and, for the
autoencoders, ``samples.png`` (rows G original, C corrupted, R reconstructed).
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainer import catalog
from trainer.loop.progress import Progress, Startup

if TYPE_CHECKING:
    from matplotlib.figure import Figure

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


class RunLog:
    def __init__(
        self,
        output_dir: Path,
        progress: Progress,
        *,
        enabled: bool,
        total_steps: int,
        examples_per_step: int,
        start_step: int,
        announce_phases: bool = False,
        elapsed_offset: float = 0.0,
        startup: Startup | None = None,
    ) -> None:
        self.announce_phases = announce_phases
        self.startup = startup
        # A resumed run continues the elapsed time of the runs before it, so
        # metrics.jsonl stays one time line (time-to-accuracy plots).
        self.elapsed_offset = elapsed_offset
        self.output_dir = output_dir
        self.progress = progress
        self.enabled = enabled
        self.total_steps = total_steps
        self.examples_per_step = examples_per_step
        self.start_step = start_step
        self._writer: Any = None
        self._t0 = self._last_time = time.perf_counter()
        self._last_step = start_step
        # Throughput after the first interval leaves out tracing and compiling.
        self._steady_from: tuple[int, float] | None = None
        # Test-set evaluations during training (--eval-every), and their time.
        self.evaluations: list[dict[str, Any]] = []
        self.evaluation_seconds = 0.0

    def begin(self) -> None:
        """Training starts now (after setup, before the first step)."""
        self._t0 = self._last_time = time.perf_counter()
        if self.enabled:
            import tensorflow as tf

            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._writer = tf.summary.create_file_writer(str(self.output_dir / "tensorboard"))

    def stepped(self) -> None:
        """A call's steps are done (the first ends the start-up)."""
        if self.startup is not None and not self.startup.done:
            self.startup.first_step()
            if self.enabled:
                preload_plotting()

    def phase(self, name: str) -> None:
        """A new training phase (announced for multi-phase models: sdae)."""
        if self.enabled and self.announce_phases:
            self.progress.phase(name)

    def record(self, step: int, loss: float, metrics: Mapping[str, float], phase: str) -> None:
        """One log interval ending at ``step``."""
        now = time.perf_counter()
        interval = max(now - self._last_time, 1e-9)
        steps_per_sec = (step - self._last_step) / interval
        overall = (step - self.start_step) / max(now - self._t0, 1e-9)
        elapsed = self.elapsed_offset + now - self._t0
        eta = (self.total_steps - step) / overall if overall > 0 else 0.0
        if self._steady_from is None:
            self._steady_from = (step, now)
        self._last_step, self._last_time = step, now
        line: dict[str, Any] = {
            "step": step,
            "phase": phase,
            "loss": loss,
            **metrics,
            "examples_per_sec": steps_per_sec * self.examples_per_step,
            "elapsed": elapsed,
        }
        if not self.enabled:
            return
        self.progress.progress(
            step=step,
            total_steps=self.total_steps,
            loss=loss,
            metrics=metrics,
            examples_per_sec=steps_per_sec * self.examples_per_step,
            steps_per_sec=steps_per_sec,
            elapsed=elapsed,
            eta=max(eta, 0.0),
        )
        with (self.output_dir / METRICS_FILE).open("a") as f:
            f.write(json.dumps(line) + "\n")
        self.scalars(step, {"loss": loss, **metrics, "examples_per_sec": line["examples_per_sec"]})

    def evaluation(
        self, step: int, epoch: float, results: Mapping[str, Any], seconds: float
    ) -> None:
        """A test-set evaluation at ``step`` that took ``seconds``: an
        ``eval`` progress event and a row of summary.json's evaluations.
        ``train_s`` is the training time to ``step``, the evaluations
        before it left out (time to accuracy)."""
        now = time.perf_counter()
        elapsed = self.elapsed_offset + now - seconds - self._t0
        self._last_time += seconds  # the next interval's throughput: training only
        row = {
            "step": step,
            "epoch": round(epoch, 4),
            "train_s": round(elapsed - self.evaluation_seconds, 3),
            "elapsed": round(elapsed, 3),
            "eval_s": round(seconds, 3),
            **results,
        }
        self.evaluation_seconds += seconds
        self.evaluations.append(row)
        if not self.enabled:
            return
        self.progress.emit("eval", **row)
        numbers = {f"test/{k}": v for k, v in results.items() if isinstance(v, int | float)}
        self.scalars(step, numbers)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        if self._writer is None:
            return
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        # tf.summary.scalar lives in the tensorboard package, which
        # tensorflow-cpu does not install; this is the same event record
        # (a float tensor tagged for TensorBoard's scalars plugin).
        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
        )
        with self._writer.as_default(step=step):
            for name, value in values.items():
                tf.summary.write(name, tf.constant(value, tf.float32), metadata=metadata)
        self._writer.flush()

    def checkpoint(self, step: int, path: str | None) -> None:
        if self.enabled and path is not None:
            self.progress.checkpoint(step, path)

    def timing(self, step: int) -> dict[str, float]:
        """Training time and throughput of this run up to ``step`` (now)."""
        now = time.perf_counter()
        seconds = now - self._t0
        examples = (step - self.start_step) * self.examples_per_step
        timing = {
            "training_seconds": seconds,
            "examples": float(examples),
            "examples_per_sec": examples / seconds if seconds > 0 else 0.0,
            "evaluation_seconds": self.evaluation_seconds,
        }
        if self._steady_from is not None and step > self._steady_from[0]:
            first_step, first_time = self._steady_from
            timing["steady_examples_per_sec"] = (
                (step - first_step) * self.examples_per_step / max(now - first_time, 1e-9)
            )
        return timing

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def write_summary(output_dir: Path, summary: Mapping[str, Any]) -> None:
    path = output_dir / SUMMARY_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def read_metrics(output_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl, including the lines of runs this one resumed."""
    path = output_dir / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_loss(
    lines: list[dict[str, Any]], path: Path, title: str, final: Mapping[str, Any] | None = None
) -> None:
    """Loss, and the model's metric, against the global step; ``final``
    (the summary) adds the final test figure as a marked point at the last
    step, so the training curve is read against what the model scored."""
    _after_warm_up()
    save_figure(loss_figure(lines, title, final), path)


def loss_figure(
    lines: list[dict[str, Any]], title: str, final: Mapping[str, Any] | None = None
) -> Figure:
    """The Figure ``plot_loss`` saves (``save_figure`` closes it)."""
    fig = new_figure(figsize=(10, 3.6))
    axes = fig.subplots(1, 2)
    steps = [line["step"] for line in lines]
    axes[0].plot(steps, [line["loss"] for line in lines], color="tab:blue")
    axes[0].set(xlabel="step", ylabel="training loss", yscale="log", title=title)
    # The summary's final test figure marked on the curve of the same metric
    # (each model's, in the catalog).
    for name, key, label in catalog.final_metrics():
        points = [(line["step"], line[name]) for line in lines if name in line]
        if points:
            xs, ys = zip(*points, strict=True)
            axes[1].plot(xs, ys, color="tab:green", label=f"training {name}")
            axes[1].set(xlabel="step", ylabel=name)
            value = (final or {}).get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                text = f"{label} {value:.4f}"
                axes[1].plot([xs[-1]], [value], marker="*", markersize=12, color="tab:red",
                             linestyle="none", label=text)  # fmt: skip
                axes[1].annotate(text, (xs[-1], value), textcoords="offset points",
                                 xytext=(-8, 8), ha="right", color="tab:red")  # fmt: skip
            axes[1].legend(fontsize="small", loc="lower right")
    for axis in axes:
        axis.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_samples(samples: Mapping[str, np.ndarray], path: Path, titles: Mapping[str, str]) -> None:
    """A grid: one row per kind (G, C, R), one column per test image."""
    _after_warm_up()
    rows = list(samples)
    columns = len(samples[rows[0]])
    fig = new_figure(figsize=(1.2 * columns + 1, 1.3 * len(rows)))
    axes = fig.subplots(len(rows), columns, squeeze=False)
    for r, kind in enumerate(rows):
        for c in range(columns):
            axis = axes[r][c]
            axis.imshow(samples[kind][c], cmap="gray", vmin=0.0, vmax=1.0)
            axis.set_xticks([])
            axis.set_yticks([])
        label = f"{kind}\n{titles.get(kind, '')}"
        axes[r][0].set_ylabel(label, rotation=0, ha="right", va="center")
    fig.tight_layout()
    save_figure(fig, path)


# matplotlib (pyplot on the Agg backend: no display) is imported for the
# plots only once training runs, in the background (``preload_plotting``):
# not on the way to the first step (trainer/imports.py). Its object API
# without pyplot (a Figure on a canvas of its own) was tried: the same
# plot took 0.2 to 0.3 s longer at the end of a job.

# The background warm-up, once started.
_warm_up: threading.Thread | None = None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # headless nodes: no display
    import matplotlib.pyplot as plt

    return plt


def new_figure(**kwargs: Any) -> Figure:
    """A figure to draw on; ``save_figure`` writes and closes it."""
    return _pyplot().figure(**kwargs)


def save_figure(figure: Figure, path: Path | io.BytesIO) -> None:
    figure.savefig(path, dpi=100, format="png")
    _pyplot().close(figure)


def _warm_up_plotting() -> None:
    # A small figure drawn to memory: imports matplotlib and loads what its
    # first drawing loads (fonts, tick formatters), which is most of the
    # first plot's time. A failure here (a broken matplotlib) is reported
    # by the plot that fails the same way.
    with contextlib.suppress(Exception):
        figure = new_figure(figsize=(1, 1))
        axis = figure.add_subplot()
        axis.plot([0, 1], [1, 0])
        axis.set(title="t", xlabel="x", yscale="log")
        figure.tight_layout()
        save_figure(figure, io.BytesIO())


def preload_plotting() -> None:
    """Import matplotlib, and draw once, in a thread of its own while the
    steps run (the chief mostly waits on TensorFlow then), so that the
    plots at the end do not wait for that. A plot made before it is done
    waits for it (``_after_warm_up``)."""
    global _warm_up
    if _warm_up is None:
        _warm_up = threading.Thread(target=_warm_up_plotting, name="warm-up-plots", daemon=True)
        _warm_up.start()


def _after_warm_up() -> None:
    """Wait for the warm-up's drawing, if one runs: matplotlib is not made
    to draw from two threads at once (its font cache is shared)."""
    if _warm_up is not None:
        _warm_up.join()
