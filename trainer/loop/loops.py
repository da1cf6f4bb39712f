"""The training loops: when steps run, and when to log, checkpoint and average.

* ``run_synchronous`` (single, sync, average): every training process runs
  the same sequence of multi-step calls, so all of them reach every log,
  checkpoint and averaging point at the same step; collectives inside the
  calls (sync) or at those points (average, checkpoint saves) line up.
* ``run_async`` (async): the chief schedules multi-step closures onto the
  workers with the ClusterCoordinator and never waits for all of them
  during a phase: it keeps a small window of closures in flight and fetches
  the oldest result to log progress, so a slow or dead worker holds up
  nothing but its own closure. A closure lost with its worker is rescheduled
  by the coordinator on another worker; steps lost with it are made up by
  scheduling again until the global step reaches the phase's end.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from trainer.errors import TrainingFailed
from trainer.loop.checkpoints import Checkpoints
from trainer.loop.outputs import RunLog
from trainer.loop.steps import CallResult
from trainer.models.base import Phase


@dataclass
class PhaseRun:
    phase: Phase
    call: Callable[[object, tf.Tensor, tf.Tensor], CallResult]


def plan_calls(start: int, end: int, per_call: int, every: Iterable[int]) -> list[int]:
    """Step counts of the calls that take the global step from ``start`` to
    ``end``: at most ``per_call`` each, and ending exactly on every multiple
    of each ``every`` (log, checkpoint, averaging points) in between."""
    marks = {end}
    for interval in every:
        if interval > 0:
            marks.update(range((start // interval + 1) * interval, end, interval))
    sizes: list[int] = []
    step = start
    for mark in sorted(m for m in marks if m > start):
        while step < mark:
            k = min(per_call, mark - step)
            sizes.append(k)
            step += k
    return sizes


class Monitor:
    """Sums losses between log points; logs and checkpoints at boundaries.
    Runs on every training process (each must take part in checkpoint
    saves); only the chief's ``RunLog`` writes anything."""

    def __init__(
        self,
        runlog: RunLog,
        checkpoints: Checkpoints,
        *,
        log_every: int,
        checkpoint_every: int,
        before_save: Callable[[], None] | None = None,
        eval_every: int = 0,
        evaluate: Callable[[int], None] | None = None,
    ) -> None:
        self.runlog = runlog
        self.checkpoints = checkpoints
        self.log_every = log_every
        self.checkpoint_every = checkpoint_every
        self.before_save = before_save
        # Steps between test-set evaluations during training (0: none).
        self.eval_every = eval_every if evaluate is not None else 0
        self.evaluate = evaluate
        self.phase: Phase | None = None
        self.last_log = self.last_checkpoint = self.last_eval = 0
        self.last_loss: float | None = None
        self._reset()

    def _reset(self) -> None:
        self.loss_sum, self.steps = 0.0, 0
        self.sums: dict[str, float] = {}

    def enter(self, phase: Phase, step: int) -> None:
        self.phase = phase
        self.last_log = self.last_checkpoint = self.last_eval = step
        self._reset()
        self.runlog.phase(phase.name)

    def add(self, result: Sequence[Any]) -> None:
        loss_sum, sums, done = result
        done = int(done)
        if done == 0:
            return
        self.runlog.stepped()
        self.loss_sum += float(loss_sum)
        self.steps += done
        for name, value in sums.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(value)

    def reached(self, step: int, *, phase_end: bool = False) -> None:
        if self._crossed(self.last_log, step, self.log_every) or (phase_end and self.steps):
            self.log(step)
        if self._crossed(self.last_checkpoint, step, self.checkpoint_every):
            self.save(step)
        if self._crossed(self.last_eval, step, self.eval_every):
            self.last_eval = step
            assert self.evaluate is not None
            self.evaluate(step)

    @staticmethod
    def _crossed(last: int, step: int, every: int) -> bool:
        return every > 0 and step // every > last // every

    def log(self, step: int) -> None:
        self.last_log = step
        if not self.steps:
            return
        loss = self.loss_sum / self.steps
        if not math.isfinite(loss):
            raise TrainingFailed(f"the loss became {loss} at step {step}; lower --learning-rate")
        metrics = {name: value / self.steps for name, value in self.sums.items()}
        assert self.phase is not None
        self.runlog.record(step, loss, metrics, self.phase.name)
        self.last_loss = loss
        self._reset()

    def save(self, step: int) -> None:
        if self.before_save is not None:
            self.before_save()
        self.last_checkpoint = step
        self.runlog.checkpoint(step, self.checkpoints.save(step))


def first_step_alone(sizes: list[int]) -> list[int]:
    """``sizes`` with the first call split into one step and the rest: the
    first call also traces and compiles, and its result ends the start-up
    (the first progress one step in, not ``--steps-per-call`` steps in).
    Every log, checkpoint and averaging point stays where it was."""
    if sizes and sizes[0] > 1:
        return [1, sizes[0] - 1, *sizes[1:]]
    return sizes


def run_synchronous(
    runs: Sequence[PhaseRun],
    iterator: object,
    monitor: Monitor,
    *,
    start: int,
    per_call: int,
    every: Sequence[int],
    after_call: Callable[[int, bool], None] | None = None,
) -> int:
    """Train every phase from global step ``start``; the final step."""
    step = start
    for run in runs:
        end = run.phase.end
        if step >= end:
            continue
        monitor.enter(run.phase, step)
        limit = tf.constant(end, tf.int64)
        sizes = plan_calls(step, end, per_call, every)
        for k in first_step_alone(sizes) if step == start else sizes:
            monitor.add(run.call(iterator, tf.constant(k, tf.int64), limit))
            step += k
            if after_call is not None:
                after_call(step, step == end)
            monitor.reached(step, phase_end=step == end)
    return step


# What a worker that dies mid-closure raises where TensorFlow's coordinator
# does not recognise it as a worker failure itself: the error text of a lost
# connection does not always name the worker's job.
WORKER_LOST = (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError)
# Consecutive failed scheduling rounds (no step made) before giving up.
MAX_FAILED_ROUNDS = 5


def run_async(
    coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator,
    runs: Sequence[PhaseRun],
    iterator: object,
    monitor: Monitor,
    step_variable: tf.Variable,
    claims: tf.Variable,
    *,
    per_call: int,
    in_flight: int,
) -> int:
    """Train every phase by scheduling closures onto the workers; the final
    global step. Phases are separated by ``coordinator.join()``: greedy
    pretraining of layer 2 must start from the finished layer 1.

    The global step on the ps is the truth: a closure whose worker died is
    rescheduled by the coordinator, and when the coordinator gives up on one
    instead (or a finished closure's result dies with its worker before it
    was fetched: its steps are on the ps already, only its loss is lost),
    the round is planned again from the global step. Reading the global step
    is also the health check of the ps: if that fails, training fails.

    Each step claims its place from ``claims`` (``steps.claim_step``), which
    each round sets to the global step: no closure is in flight then, and
    places claimed by steps that never ran (their worker died) are given
    out again.
    """
    scheduler = _Scheduler(
        coordinator, iterator, monitor, step_variable, claims, per_call, in_flight
    )
    start = scheduler.global_step()
    for run in runs:
        scheduler.train_phase(run, start)
    return scheduler.global_step()


class _Scheduler:
    """``run_async``'s rounds: closures scheduled, results collected, the
    global step read back from the ps."""

    def __init__(
        self,
        coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator,
        iterator: object,
        monitor: Monitor,
        step_variable: tf.Variable,
        claims: tf.Variable,
        per_call: int,
        in_flight: int,
    ) -> None:
        self.coordinator = coordinator
        self.iterator = iterator
        self.monitor = monitor
        self.step_variable = step_variable
        self.claims = claims
        self.per_call = per_call
        self.in_flight = in_flight

    def global_step(self) -> int:
        return int(np.asarray(self.step_variable.numpy()))

    def train_phase(self, run: PhaseRun, start: int) -> None:
        """Rounds until the global step reaches the phase's end (``start``:
        the run's first step, which a round runs alone)."""
        end = run.phase.end
        step = self.global_step()
        if step >= end:
            return
        self.monitor.enter(run.phase, step)
        limit = tf.constant(end, tf.int64)
        failed_rounds = 0
        while step < end:
            try:
                self.round(run, step, limit, first=step == start)
            except WORKER_LOST as e:
                print(f"trainer: a worker failed, rescheduling: {_first_line(e)}", flush=True)
                # A round that ends early (a read of the ps failed in
                # collect) may leave closures running: none may be when the
                # next round sets the claims back, or their steps would come
                # on top. A round that ends normally has joined them all.
                self.settle()
            before, step = step, self.global_step()
            failed_rounds = 0 if step > before else failed_rounds + 1
            if failed_rounds > MAX_FAILED_ROUNDS:
                raise TrainingFailed(f"no worker made progress in {MAX_FAILED_ROUNDS} rounds")
        self.monitor.reached(step, phase_end=True)

    def settle(self) -> None:
        """Return once no closure is in flight: ``join`` raises a closure's
        error once (the coordinator cancels the others and waits for those
        running first), and returns when all are done."""
        for _ in range(MAX_FAILED_ROUNDS):
            try:
                self.coordinator.join()
                return
            except WORKER_LOST as e:
                print(f"trainer: a worker failed: {_first_line(e)}", flush=True)
        self.coordinator.join()

    def round(self, run: PhaseRun, step: int, limit: tf.Tensor, *, first: bool) -> None:
        """Closures for the steps from ``step`` to the phase's end, at most
        ``in_flight`` of them unfetched at a time; returns once all are in."""
        end = run.phase.end
        pending: deque[Any] = deque()
        self.claims.assign(step)
        sizes = plan_calls(step, end, self.per_call, ())
        for k in first_step_alone(sizes) if first else sizes:
            args = (self.iterator, tf.constant(k, tf.int64), limit)
            pending.append(self.coordinator.schedule(run.call, args=args))
            while len(pending) > self.in_flight:
                self.collect(pending.popleft(), end)
        if first and pending:
            # The run's first result (one step), as soon as it is in, not
            # when the whole round is: it ends the start-up.
            self.collect(pending.popleft(), end)
        self.coordinator.join()
        while pending:
            self.collect(pending.popleft(), end)

    def collect(self, result: Any, end: int) -> None:
        try:
            self.monitor.add(result.fetch())
        except WORKER_LOST as e:
            print(f"trainer: lost a closure's result with its worker: {_first_line(e)}", flush=True)
        step = self.global_step()
        # The global step runs ahead of the results fetched so far: once it
        # reached the phase's end, the closures still in flight hold that
        # end's last steps, and the end is logged once, when all are in
        # (logged here too, it came twice: the second row 0 steps later).
        if step < end:
            self.monitor.reached(step)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
