"""One training run on a training process: state, inputs, loop, results.

Every process that trains (the chief in async mode; chief and workers in
sync and average mode; the one process in single mode) builds the same
state in the same order, so that collective variable creation and every
collective of the loop line up. Only the chief restores checkpoints, writes
the run folder and speaks the progress protocol.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from trainer import collectives, distribute
from trainer.checkpoints import Checkpoints
from trainer.data import count_examples, load_split
from trainer.distribute import ClusterInfo
from trainer.flags import Config
from trainer.inputs import stream_key, worker_stream_key
from trainer.loop import Monitor, PhaseRun, run_async, run_synchronous
from trainer.models import create_task
from trainer.models.base import Phase, Task
from trainer.outputs import (
    METRICS_FILE,
    RunLog,
    plot_loss,
    plot_samples,
    read_metrics,
    write_summary,
)
from trainer.progress import Progress
from trainer.steps import CallResult, overlapped_calls, train_calls


@dataclass
class State:
    """Everything a checkpoint holds, created up front."""

    model: keras.Model
    phases: list[Phase]
    optimizers: list[keras.optimizers.Optimizer]
    step: tf.Variable  # the global step

    def variables(self) -> list[Any]:
        return [
            *self.model.variables,
            *(v for o in self.optimizers for v in o.variables),
            self.step,
        ]

    def checkpoint(self) -> tf.train.Checkpoint:
        optimizers = {f"optimizer_{i}": o for i, o in enumerate(self.optimizers)}
        return tf.train.Checkpoint(model=self.model, step=self.step, **optimizers)


# TensorFlow objects a finished collective run keeps until the process exits.
_NEVER_RELEASED: list[Any] = []


def weights_fingerprint(variables: list[Any]) -> str:
    """A short hash of parameter values: equal on every worker of a sync or
    average job after training (the logs show it, the tests compare it)."""
    digest = hashlib.sha256()
    for v in variables:
        digest.update(v.numpy().tobytes())
    return digest.hexdigest()[:16]


class Training:
    def __init__(
        self,
        config: Config,
        info: ClusterInfo,
        strategy: tf.distribute.Strategy,
        progress: Progress,
        data_dir: Path,
    ) -> None:
        self.config = config
        self.info = info
        self.strategy = strategy
        self.progress = progress
        self.data_dir = data_dir
        self.mode = config.mode
        self.is_chief = info.is_chief
        self.output_dir = Path(config.output_dir)
        self.workers = distribute.num_workers(info, config.mode)
        self.ps = info.num_ps if config.mode == "async" else 0
        # Several processes run this program and must meet in collectives.
        self.collective = self.mode in ("sync", "average") and self.workers > 1
        if self.mode == "average":
            # Each worker steps its private replica: one batch per worker.
            self.examples_per_step = config.batch_size * self.workers
        else:
            self.examples_per_step = config.batch_size * strategy.num_replicas_in_sync

    def run(self) -> None:
        config = self.config
        started = datetime.now(UTC)
        coordinator = (
            tf.distribute.coordinator.ClusterCoordinator(self.strategy)
            if self.mode == "async"
            else None
        )
        keras.utils.set_random_seed(config.seed)
        task = create_task(config)
        total_steps = self.total_steps(task)
        state = self.build_state(task, total_steps)
        checkpoints = Checkpoints(state.checkpoint(), self.output_dir, is_chief=self.is_chief)
        restored = checkpoints.restore_latest() if config.resume and self.is_chief else None
        if self.collective and (config.resume or self.mode == "average"):
            # Only the chief read the checkpoint (nodes need not share a
            # disk); average mode's private replicas must also start equal.
            collectives.broadcaster(self.strategy, state.variables())()
        start = int(state.step.numpy())

        iterator = self.input_iterator(task, start, coordinator)
        train_strategy = tf.distribute.get_strategy() if self.mode == "average" else self.strategy
        runs = [
            PhaseRun(phase, self.calls(train_strategy, phase, optimizer, state))
            for phase, optimizer in zip(state.phases, state.optimizers, strict=True)
        ]
        average = (
            collectives.averager(self.strategy, state.model.variables)
            if self.mode == "average"
            else None
        )
        runlog = self.run_log(total_steps, start, announce_phases=len(state.phases) > 1)
        monitor = Monitor(
            runlog,
            checkpoints,
            log_every=config.log_every,
            checkpoint_every=config.checkpoint_every,
            before_save=average,  # a checkpoint holds averaged parameters
        )
        self.progress.start(
            model=config.model,
            mode=self.mode,
            total_steps=total_steps,
            workers=self.workers,
            ps=self.ps,
            output_dir=str(self.output_dir),
            resumed_from_step=start,
        )
        print(
            f"trainer: {self.info.name} training {config.model} ({self.mode}) "
            f"from step {start} to {total_steps}",
            flush=True,
        )

        runlog.begin()
        if coordinator is not None:
            final_step = run_async(
                coordinator,
                runs,
                iterator,
                monitor,
                state.step,
                per_call=config.steps_per_call,
                in_flight=2 * self.workers,
            )
        else:
            every = [config.log_every, config.checkpoint_every]
            if average is not None:
                every.append(config.average_every)
            final_step = run_synchronous(
                runs,
                iterator,
                monitor,
                start=start,
                per_call=config.steps_per_call,
                every=every,
                after_call=self.averaging(average),
            )
        timing = runlog.timing(final_step)
        if checkpoints.last_saved_step != final_step:
            monitor.save(final_step)
        if self.mode in ("sync", "average"):
            fingerprint = weights_fingerprint(state.model.variables)
            print(
                f"trainer: {self.info.name} weights fingerprint {fingerprint} at step {final_step}",
                flush=True,
            )

        if self.is_chief:
            summary = {
                "model": config.model,
                "mode": self.mode,
                "workers": self.workers,
                "ps": self.ps,
                "steps": final_step,
                "total_steps": total_steps,
                "batch_size": config.batch_size,
                "examples_per_step": self.examples_per_step,
                "learning_rate": config.learning_rate,
                **timing,
                "final_loss": monitor.last_loss,
                "phases": [{"name": p.name, "start": p.start, "end": p.end} for p in state.phases],
                "optimizer_iterations": {
                    p.name: int(o.iterations.numpy())
                    for p, o in zip(state.phases, state.optimizers, strict=True)
                },
                "model_settings": task.describe(),
                "steps_per_call": config.steps_per_call,
                "jit": config.jit,
                **({"overlap": self.overlapped(self.strategy)} if self.mode == "async" else {}),
                **({"average_every": config.average_every} if self.mode == "average" else {}),
                "tf_version": tf.__version__,
                "keras_version": keras.__version__,
                "resumed_from_step": start,
                "resumed_from_checkpoint": restored,
                "seed": config.seed,
                "started": started.isoformat(timespec="seconds"),
                "output_dir": str(self.output_dir),
            }
            self.finish(task, state.model, runlog, summary)
        runlog.close()
        if self.collective:
            # Workers wait for the chief's evaluation, so that nobody sees a
            # peer vanish while it still works.
            collectives.barrier(self.strategy)
            # Deleting a MultiWorkerMirroredStrategy input iterator can block
            # for 30 s and more (TF 2.21, seen on a busy machine); a
            # collective task leaves by os._exit (``__main__.leave``) before
            # anything kept here would be deleted.
            _NEVER_RELEASED.append(iterator)
            collectives.leave_together(self.info)

    def calls(
        self,
        strategy: tf.distribute.Strategy,
        phase: Phase,
        optimizer: keras.optimizers.Optimizer,
        state: State,
    ) -> Callable[[object, tf.Tensor, tf.Tensor], CallResult]:
        """The phase's multi-step call: in async mode with one replica per
        worker (and --overlap) overlapped with the ps's updates, else step by
        step."""
        config = self.config
        if self.overlapped(strategy):
            return overlapped_calls(
                strategy, phase, optimizer, state.model.variables, state.step, jit=config.jit
            )
        return train_calls(
            strategy,
            phase,
            optimizer,
            state.model.variables,
            state.step,
            jit=config.jit,
            guard=self.mode == "async",
        )

    def overlapped(self, strategy: tf.distribute.Strategy) -> bool:
        return self.mode == "async" and self.config.overlap and strategy.num_replicas_in_sync == 1

    def total_steps(self, task: Task) -> int:
        if self.config.steps is not None:
            return self.config.steps
        assert self.config.epochs is not None
        epoch = task.train_examples(count_examples(self.data_dir, "train"))
        return max(1, math.ceil(self.config.epochs * epoch / self.examples_per_step))

    def build_state(self, task: Task, total_steps: int) -> State:
        """Every variable of every phase, and every optimizer slot, before the
        first step. Average mode's replicas are private to each worker: built
        outside any strategy scope, kept in step by collectives."""
        scope = contextlib.nullcontext() if self.mode == "average" else self.strategy.scope()
        with scope:
            model = task.build_model()
            phases = task.phases(model, total_steps)
            optimizers = []
            for phase in phases:
                optimizer = keras.optimizers.Adam(self.config.learning_rate)
                optimizer.build(list(phase.variables))
                optimizers.append(optimizer)
            step = tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                name="global_step",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
        return State(model, phases, optimizers, step)

    def input_iterator(
        self,
        task: Task,
        start: int,
        coordinator: tf.distribute.coordinator.ClusterCoordinator | None,
    ) -> Any:
        """This run's batches: per worker (async), per replica (sync,
        single) or for the private replica (average)."""
        config, data_dir = self.config, str(self.data_dir)

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            if self.mode == "async":
                # Which worker ran which step is not recorded: a resumed
                # async run draws fresh streams (salted by the step) instead.
                key = worker_stream_key(config.seed, salt=start)
                return task.build_inputs(data_dir, config.batch_size, 0, key)
            per_pipeline = max(1, context.num_replicas_in_sync // context.num_input_pipelines)
            key = stream_key(config.seed, context.input_pipeline_id)
            return task.build_inputs(data_dir, config.batch_size, start * per_pipeline, key)

        if coordinator is not None:
            return iter(
                coordinator.create_per_worker_dataset(
                    lambda: self.strategy.distribute_datasets_from_function(dataset_fn)
                )
            )
        if self.mode == "average":
            context = tf.distribute.InputContext(
                num_input_pipelines=self.workers,
                input_pipeline_id=distribute.worker_index(self.info),
                num_replicas_in_sync=1,
            )
            return iter(dataset_fn(context))
        return iter(self.strategy.distribute_datasets_from_function(dataset_fn))

    def averaging(self, average: Callable[[], None] | None) -> Callable[[int, bool], None] | None:
        """Average mode's hook after each call: average the parameters every
        ``--average-every`` steps and at the end of each phase."""
        if average is None:
            return None
        every = self.config.average_every

        def after_call(step: int, phase_end: bool) -> None:
            if step % every == 0 or phase_end:
                average()

        return after_call

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
            enabled=self.is_chief,
            total_steps=total_steps,
            examples_per_step=self.examples_per_step,
            start_step=start,
            announce_phases=announce_phases,
            elapsed_offset=elapsed_before,
        )

    def finish(
        self, task: Task, model: keras.Model, runlog: RunLog, summary: dict[str, Any]
    ) -> None:
        """Evaluate, then write summary.json and the plots (chief only)."""
        output_dir = self.output_dir
        if self.config.eval:
            evaluation = task.evaluate(model, load_split(self.data_dir, "test"), self.config.seed)
            summary.update(evaluation.results)
            runlog.scalars(
                summary["steps"], {f"test/{k}": v for k, v in evaluation.results.items()}
            )
            if evaluation.samples:
                titles = {
                    "C": f"{summary['psnr_corrupted']:.1f} dB",
                    "R": f"{summary['psnr_reconstructed']:.1f} dB",
                }
                plot_samples(evaluation.samples, output_dir / "samples.png", titles)
        summary["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        output_dir.mkdir(parents=True, exist_ok=True)
        write_summary(output_dir, summary)
        lines = read_metrics(output_dir)
        if lines:
            plot_loss(lines, output_dir / "loss.png", f"{summary['model']} ({summary['mode']})")
        self.progress.done(summary)
