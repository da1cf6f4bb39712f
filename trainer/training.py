"""One training run on a training process: state, inputs, loop, results.

Every process that trains (the chief in async mode; chief and workers in
sync, average and ensemble mode; the one process in single mode) builds the
same state in the same order, so that collective variable creation and
every collective of the loop line up. Only the chief restores checkpoints,
writes the run folder and speaks the progress protocol.

``Training.run`` is the skeleton every mode shares; where the modes differ
it asks its ``TrainingMode`` (``trainer/modes/``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from trainer import modes
from trainer.data.mnist import count_examples, load_split
from trainer.distribution import accelerators
from trainer.distribution.strategy import ClusterInfo
from trainer.flags import Config
from trainer.loop import schedules
from trainer.loop.checkpoints import Checkpoints, State
from trainer.loop.loops import Monitor, PhaseRun
from trainer.loop.outputs import (
    METRICS_FILE,
    RunLog,
    plot_loss,
    plot_samples,
    read_metrics,
    write_summary,
)
from trainer.loop.progress import Progress, Startup
from trainer.loop.steps import count_atomically
from trainer.models import create_task
from trainer.models.base import Task


class Training:
    """The skeleton every mode runs; ``self.mode`` (``trainer/modes/``) does
    what differs between them."""

    def __init__(
        self,
        config: Config,
        info: ClusterInfo,
        strategy: tf.distribute.Strategy,
        progress: Progress,
        data_dir: Path,
        startup: Startup | None = None,
    ) -> None:
        self.mode = modes.create(config, info, strategy)
        # The mode's configuration (an ensemble member's: its model and seed).
        self.config = config = self.mode.config
        self.startup = startup or Startup(progress)
        self.finish_s: dict[str, float] = {}
        self.info = info
        self.strategy = strategy
        self.progress = progress
        self.data_dir = data_dir
        self.is_chief = info.is_chief
        self.output_dir = Path(config.output_dir)
        self.workers = self.mode.workers
        self.ps = self.mode.ps
        self.examples_per_step = self.mode.examples_per_step

    def run(self) -> None:
        config, mode = self.config, self.mode
        started = datetime.now(UTC)
        keras.utils.set_random_seed(config.seed)
        # Before the model is built: its layers take the policy then.
        accelerators.set_precision(config.mixed_precision)
        task = create_task(config)
        total_steps = self.total_steps(task)
        state = self.build_state(task, total_steps)
        checkpoints = self.checkpoints(state)
        restored = checkpoints.restore_latest() if config.resume and self.is_chief else None
        mode.prepare(state)
        start = int(state.step.numpy())

        iterator = mode.input_iterator(task, self.data_dir, start)
        runs = [
            PhaseRun(phase, mode.calls(phase, optimizer, state))
            for phase, optimizer in zip(state.phases, state.optimizers, strict=True)
        ]
        runlog = self.run_log(total_steps, start, announce_phases=len(state.phases) > 1)
        monitor = self.monitor(task, state, runlog, checkpoints)
        self.announce(total_steps, start)

        runlog.begin()
        final_step = mode.loop(runs, iterator, monitor, state.step, start)
        timing = runlog.timing(final_step)
        finished = time.monotonic()
        if checkpoints.last_saved_step != final_step:
            monitor.save(final_step)
        self.finish_s = {"checkpoint": time.monotonic() - finished}
        results = mode.after_training(state.model, final_step, self.data_dir)

        if self.is_chief:
            summary = self.summary(
                task,
                state,
                total_steps=total_steps,
                final_step=final_step,
                timing=timing,
                final_loss=monitor.last_loss,
                start=start,
                restored=restored,
                started=started,
            )
            summary["evaluations"] = runlog.evaluations
            self.finish(task, state.model, runlog, summary, results)
        runlog.close()
        mode.leave(iterator)

    def checkpoints(self, state: State) -> Checkpoints:
        """Where the state is saved, in the mode's way (the chief writes)."""
        return Checkpoints(
            state.checkpoint(),
            self.output_dir,
            is_chief=self.is_chief,
            keep=self.config.keep_checkpoints,
            options=self.mode.checkpoint_options(),
        )

    def monitor(
        self, task: Task, state: State, runlog: RunLog, checkpoints: Checkpoints
    ) -> Monitor:
        """What the loop does between steps: progress, checkpoints and the
        evaluations --eval-every asks for."""
        config = self.config
        eval_every = self.eval_every_steps(task)
        return Monitor(
            runlog,
            checkpoints,
            log_every=config.log_every,
            checkpoint_every=config.checkpoint_every,
            before_save=self.mode.before_save,
            eval_every=eval_every,
            evaluate=self.evaluator(task, state.model, runlog, eval_every) if eval_every else None,
        )

    def announce(self, total_steps: int, start: int) -> None:
        """The state is built: on the progress protocol and in the log."""
        config = self.config
        self.startup.mark("build")
        self.progress.start(
            model=config.model,
            mode=self.mode.name,
            total_steps=total_steps,
            workers=self.workers,
            ps=self.ps,
            output_dir=str(self.output_dir),
            resumed_from_step=start,
        )
        print(
            f"trainer: {self.info.name} training {config.model} ({self.mode.name}) "
            f"from step {start} to {total_steps}",
            flush=True,
        )

    def summary(
        self,
        task: Task,
        state: State,
        *,
        total_steps: int,
        final_step: int,
        timing: dict[str, float],
        final_loss: float | None,
        start: int,
        restored: str | None,
        started: datetime,
    ) -> dict[str, Any]:
        """summary.json, but for the evaluation and the finish (``finish``)."""
        config = self.config
        return {
            "model": config.model,
            "mode": self.mode.name,
            "workers": self.workers,
            "ps": self.ps,
            "steps": final_step,
            "total_steps": total_steps,
            "batch_size": config.batch_size,
            "examples_per_step": self.examples_per_step,
            "learning_rate": config.learning_rate,
            "lr_schedule": config.lr_schedule,
            # The step size at the end: 0 after a whole cosine schedule.
            "final_learning_rate": {
                p.name: schedules.current(o)
                for p, o in zip(state.phases, state.optimizers, strict=True)
            },
            **timing,
            "final_loss": final_loss,
            "eval_every": self.config.eval_every,
            "phases": [{"name": p.name, "start": p.start, "end": p.end} for p in state.phases],
            "startup_s": self.startup.summary(),
            "optimizer_iterations": {
                p.name: int(o.iterations.numpy())
                for p, o in zip(state.phases, state.optimizers, strict=True)
            },
            "model_settings": task.describe(),
            "steps_per_call": config.steps_per_call,
            "jit": config.jit,
            "mixed_precision": config.mixed_precision,
            "devices": accelerators.replica_devices(self.mode.train_strategy),
            "gpu_memory_peak_bytes": accelerators.memory_peaks(),
            **self.mode.summary(),  # the mode's own settings
            "tf_version": tf.__version__,
            "keras_version": keras.__version__,
            "resumed_from_step": start,
            "resumed_from_checkpoint": restored,
            "seed": config.seed,
            "started": started.isoformat(timespec="seconds"),
            "output_dir": str(self.output_dir),
        }

    def total_steps(self, task: Task) -> int:
        if self.config.steps is not None:
            return self.config.steps
        assert self.config.epochs is not None
        return max(1, math.ceil(self.config.epochs * self.epoch_steps(task)))

    def epoch_steps(self, task: Task) -> float:
        """Global steps in one pass over the training set."""
        epoch = task.train_examples(count_examples(self.data_dir, "train"))
        return epoch / self.examples_per_step

    def eval_every_steps(self, task: Task) -> int:
        """--eval-every's epochs in global steps (0: no evaluation during training)."""
        if self.config.eval_every is None:
            return 0
        return max(1, round(self.config.eval_every * self.epoch_steps(task)))

    def evaluator(
        self, task: Task, model: keras.Model, runlog: RunLog, every: int
    ) -> Callable[[int], None]:
        """``evaluate(step)``: the test set scored now, by the mode
        (``evaluate_now``), recorded by the chief's ``runlog``."""
        test = load_split(self.data_dir, "test")
        epoch_steps = self.epoch_steps(task)

        def evaluate(step: int) -> None:
            began = time.perf_counter()
            results = self.mode.evaluate_now(task, model, test)
            if results is not None:
                seconds = time.perf_counter() - began
                runlog.evaluation(step, step / epoch_steps, results, seconds)

        return evaluate

    def build_state(self, task: Task, total_steps: int) -> State:
        """Every variable of every phase, and every optimizer slot, before the
        first step, in the mode's scope (average and ensemble modes' models
        are private to each process: built outside any strategy scope)."""
        with self.mode.scope():
            model = self.mode.build_model(task)
            phases = task.phases(model, total_steps)
            optimizers = []
            for phase in phases:
                optimizer = self.mode.optimizer(schedules.learning_rate(self.config, phase))
                if self.config.mixed_precision:
                    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
                optimizer.build(list(phase.variables))
                count_atomically(optimizer)
                optimizers.append(optimizer)
            step = tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                name="global_step",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
        return State(model, phases, optimizers, step)

    def run_log(self, total_steps: int, start: int, *, announce_phases: bool) -> RunLog:
        elapsed_before = 0.0
        if self.is_chief:
            if self.config.resume:
                before = read_metrics(self.output_dir)
                elapsed_before = max(
                    (x["elapsed"] for x in before if x["step"] <= start), default=0.0
                )
            else:  # a new run in an old folder starts a new time line
                (self.output_dir / METRICS_FILE).unlink(missing_ok=True)
        return RunLog(
            self.output_dir,
            self.progress,
            startup=self.startup,
            enabled=self.is_chief,
            total_steps=total_steps,
            examples_per_step=self.examples_per_step,
            start_step=start,
            announce_phases=announce_phases,
            elapsed_offset=elapsed_before,
        )

    def finish(
        self,
        task: Task,
        model: keras.Model,
        runlog: RunLog,
        summary: dict[str, Any],
        results: dict[str, Any] | None = None,
    ) -> None:
        """Evaluate (or take the ensemble's ``results``), then write
        summary.json and the plots (chief only)."""
        output_dir = self.output_dir
        began = time.monotonic()
        if results is not None:
            summary.update(results)
            runlog.scalars(
                summary["steps"],
                {"test/accuracy": results["test_accuracy"], "test/loss": results["test_loss"]},
            )
        elif self.config.eval:
            evaluation = task.evaluate(model, load_split(self.data_dir, "test"), self.config.seed)
            summary.update(evaluation.results)
            runlog.scalars(
                summary["steps"], {f"test/{k}": v for k, v in evaluation.results.items()}
            )
            if evaluation.samples:
                plot_samples(evaluation.samples, output_dir / "samples.png", evaluation.titles)
        self.finish_s["evaluate"] = time.monotonic() - began
        summary["finish_s"] = {k: round(v, 3) for k, v in self.finish_s.items()}
        summary["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        output_dir.mkdir(parents=True, exist_ok=True)
        write_summary(output_dir, summary)
        began = time.monotonic()
        lines = read_metrics(output_dir)
        if lines:
            plot_loss(
                lines, output_dir / "loss.png", f"{summary['model']} ({summary['mode']})", summary
            )
        self.progress.done(summary)
        print(
            f"trainer: after the last step: final checkpoint {self.finish_s['checkpoint']:.2f} s, "
            f"evaluation {self.finish_s['evaluate']:.2f} s, plots {time.monotonic() - began:.2f} s",
            flush=True,
        )
