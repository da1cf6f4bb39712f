"""``--mode layers``' training step, and the time each stage computes in it.

One ``tf.function`` per step holds the whole model: the layers' operations
carry their stage's device (``trainer/modes/placement.py``), so TensorFlow cuts
the function into one part per task and runs the parts at once, sending
activations forward and gradients back over gRPC as soon as they exist.
With ``--micro-batches M`` the batch is cut into M pieces whose forward and
backward passes are independent until their gradients are summed: while
stage k+1 works on piece j, stage k already works on piece j+1 (GPipe's
schedule, made by TensorFlow's dataflow rather than by a loop of ours).
Gradients come from ``tf.gradients``, which places each gradient operation
with the operation it differentiates (a ``GradientTape`` would place the
whole backward pass wherever ``tape.gradient`` is called).

Each stage time-stamps, on its own device, when a piece enters and leaves
it forwards and when its gradient arrives and leaves backwards. A stage's
busy time in a step is the union of those intervals; the rest of the step
it waits: the pipeline's bubble (``StageTiming``). The stamps are taken by
a small function of their own that reads a variable of the stage: a bare
``tf.timestamp`` is ordered after every other stateful operation of the
function by its automatic control dependencies, which would chain the
stages' stamps (but not their work) one after the other.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.data.inputs import step_seed
from trainer.loop.steps import read_values
from trainer.models.base import Batch, Phase
from trainer.modes import placement

# f_start, f_end, b_start, b_end of one piece on one stage.
STAMPS = 4


def split_batch(batch: Batch, pieces: int) -> list[Batch]:
    """``pieces`` micro-batches of ``batch``: every per-example entry cut
    along its first axis; the step's random seed folded with the piece's
    number (the same seed would draw the same dropout masks in each)."""
    if pieces == 1:
        return [batch]
    cut = {k: tf.split(v, pieces) for k, v in batch.items() if k != "seed"}
    out = []
    for j in range(pieces):
        piece = {k: parts[j] for k, parts in cut.items()}
        if "seed" in batch:
            piece["seed"] = step_seed(batch["seed"], 7919 + j)
        out.append(piece)
    return out


class _Calls:
    """Which tensors enter and leave each stage, per piece, while the step
    is traced (a ``placement.CallRecorder``)."""

    def __init__(self) -> None:
        self.piece = 0
        self.entries: dict[tuple[int, int], list[tf.Tensor]] = {}
        self.exits: dict[tuple[int, int], list[tf.Tensor]] = {}
        # Entries that are another stage's output: their gradient is the
        # stage's last backward work.
        self.handed: dict[tuple[int, int], list[tf.Tensor]] = {}
        self._outputs: set[Any] = set()

    def enter(self, stage: int, args: tuple[Any, ...]) -> tuple[Any, ...]:
        key = (self.piece, stage)
        if key in self.entries:
            return args
        # On the stage's device (the placed call's scope): the stamp after
        # it marks the input's arrival, not its sending.
        moved = tf.nest.map_structure(
            lambda t: tf.identity(t) if isinstance(t, tf.Tensor) else t, args
        )
        pairs = [
            (old, new)
            for old, new in zip(tf.nest.flatten(args), tf.nest.flatten(moved), strict=True)
            if isinstance(new, tf.Tensor)
        ]
        self.entries[key] = [new for _, new in pairs]
        self.handed[key] = [
            new for old, new in pairs if new.dtype.is_floating and old.ref() in self._outputs
        ]
        return tuple(moved)

    def leave(self, stage: int, outputs: Any) -> None:
        tensors = [t for t in tf.nest.flatten(outputs) if isinstance(t, tf.Tensor)]
        self.exits[(self.piece, stage)] = tensors
        self._outputs.update(t.ref() for t in tensors)


def _stamper(device: str, anchor: Any) -> Callable[[Sequence[Any]], tf.Tensor]:
    """``stamp(after)``: the time on ``device`` once ``after`` exist."""

    # The unused resource input keeps the call out of the chain of
    # stateful operations (module docstring).
    @tf.function(autograph=False)
    def now(handle: Any) -> tf.Tensor:
        with tf.device(device):
            return tf.timestamp()

    def stamp(after: Sequence[Any]) -> tf.Tensor:
        with tf.device(device), tf.control_dependencies([t for t in after if t is not None]):
            return now(anchor.value.handle)

    return stamp


@dataclass
class StageTiming:
    """Seconds each stage computed, and the steps' wall time, over the
    measured steps (not a step that traced its function)."""

    stages: int
    busy: np.ndarray = field(init=False)
    wall: float = 0.0
    steps: int = 0

    def __post_init__(self) -> None:
        self.busy = np.zeros(self.stages)

    def add(self, stamps: np.ndarray, wall: float) -> None:
        """One step: ``stamps`` [stages, pieces, 4] from each stage's clock."""
        self.steps += 1
        self.wall += wall
        for k in range(self.stages):
            # A piece that did not reach the stage has zeros; a stage with
            # nothing to do backwards (its weights frozen), an empty span.
            spans = [(a, b) for row in stamps[k] for a, b in (row[0:2], row[2:4]) if b > a > 0]
            self.busy[k] += min(_union(spans), wall)

    def summary(self) -> dict[str, Any]:
        idle = [1.0 - b / self.wall if self.wall > 0 else 0.0 for b in self.busy]
        return {
            "stage_seconds": [round(float(b), 4) for b in self.busy],
            "bubble_per_stage": [round(float(x), 4) for x in idle],
            "bubble": round(float(np.mean(idle)), 4) if self.wall > 0 else None,
            "measured_steps": self.steps,
            "measured_seconds": round(self.wall, 3),
        }


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, -np.inf
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return float(total)


class PipelineStep:
    """``call(iterator, k, limit)`` (a phase's multi-step call): ``k`` steps,
    one function call each, timed."""

    def __init__(
        self,
        phase: Phase,
        optimizer: keras.optimizers.Optimizer,
        variables: Sequence[Any],
        step: tf.Variable,
        devices: Sequence[str],
        pieces: int,
        timing: StageTiming,
    ) -> None:
        self.phase = phase
        self.optimizer = optimizer
        self.variables = list(variables)
        self.step = step
        self.devices = list(devices)
        self.pieces = pieces
        self.timing = timing
        stage_of = [_stage_of(v, devices) for v in self.variables]
        self.stage_of = stage_of
        self.stamps = [
            _stamper(d, next(v for v, s in zip(self.variables, stage_of, strict=True) if s == k))
            for k, d in enumerate(devices)
        ]
        self.traced = False
        # The step's graph, once traced (which operations went where).
        self.graph: tf.Graph | None = None
        self.train_step = tf.function(self._train_step, autograph=False)

    def __call__(self, iterator: Any, k: tf.Tensor, limit: tf.Tensor) -> tuple[Any, ...]:
        loss_sum, sums, done = 0.0, dict.fromkeys(self.phase.metric_names, 0.0), 0
        for _ in range(int(k)):
            batch = next(iterator)
            began = time.perf_counter()
            loss, metrics, stamps = self.train_step(batch)
            loss_sum += float(loss)
            wall = time.perf_counter() - began
            if self.traced:  # the first call traced and built the function
                self.timing.add(stamps.numpy(), wall)
            self.traced = True
            sums = {name: sums[name] + float(metrics[name]) for name in sums}
            done += 1
        return loss_sum, sums, done

    def _train_step(self, batch: Batch) -> tuple[tf.Tensor, dict[str, tf.Tensor], tf.Tensor]:
        self.graph = tf.compat.v1.get_default_graph()
        values = read_values(self.variables)
        position = {id(v): i for i, v in enumerate(self.variables)}
        trained = [position[id(v)] for v in self.phase.variables]
        mapping = list(zip(self.variables, values, strict=True))
        calls = _Calls()
        per_piece: list[list[tf.Tensor | None]] = []
        loss_total = tf.constant(0.0)
        metric_sums = {name: tf.constant(0.0) for name in self.phase.metric_names}
        stamps: list[tf.Tensor] = []
        for j, piece in enumerate(split_batch(batch, self.pieces)):
            calls.piece = j
            # The loss where the last stage is: only a scalar leaves it.
            with (
                placement.recording(calls),
                keras.StatelessScope(state_mapping=mapping),
                tf.device(self.devices[-1]),
            ):
                per_example, metrics = self.phase.loss(piece)
                examples = tf.cast(tf.shape(per_example)[0] * self.pieces, tf.float32)
                loss = tf.reduce_sum(per_example) / examples
            grads = self._gradients(loss, values, trained, calls, j, stamps)
            per_piece.append(grads)
            loss_total += loss
            metric_sums = {n: metric_sums[n] + tf.cast(metrics[n], tf.float32) for n in metric_sums}
        summed = []
        for n, i in enumerate(trained):
            with tf.device(self.devices[self.stage_of[i]]):
                parts = [g[n] for g in per_piece if g[n] is not None]
                summed.append(tf.add_n(parts) if parts else tf.zeros_like(values[i]))
        self.optimizer.apply(summed, self.phase.variables)
        self.step.assign_add(1)
        metrics = {n: v / self.pieces for n, v in metric_sums.items()}
        by_piece = tf.reshape(tf.stack(stamps), [self.pieces, len(self.devices), STAMPS])
        return loss_total, metrics, tf.transpose(by_piece, [1, 0, 2])

    def _gradients(
        self,
        loss: tf.Tensor,
        values: list[tf.Tensor],
        trained: list[int],
        calls: _Calls,
        piece: int,
        stamps: list[tf.Tensor],
    ) -> list[tf.Tensor | None]:
        """The piece's gradients of the ``trained`` values; its stamps
        appended, stage by stage."""
        stages = range(len(self.devices))
        watched = [values[i] for i in trained]
        exits = {
            k: [t for t in calls.exits.get((piece, k), []) if t.dtype.is_floating] for k in stages
        }
        handed = {k: calls.handed.get((piece, k), []) for k in stages}
        extra = [t for k in stages for t in exits[k] + handed[k]]
        grads = tf.gradients(loss, watched + extra)
        weights, rest = grads[: len(watched)], iter(grads[len(watched) :])
        trained_stage = [self.stage_of[i] for i in trained]
        for k in stages:
            exit_grads = [next(rest) for _ in exits[k]]
            handed_grads = [next(rest) for _ in handed[k]]
            if (piece, k) not in calls.entries:
                stamps.extend(tf.zeros([], tf.float64) for _ in range(STAMPS))
                continue
            own = [g for g, s in zip(weights, trained_stage, strict=True) if s == k]
            arrived = [g for g in exit_grads if g is not None] or own
            stamps.append(self.stamps[k](calls.entries[(piece, k)]))
            stamps.append(self.stamps[k](calls.exits.get((piece, k), [])))
            stamps.append(self.stamps[k](arrived))
            stamps.append(self.stamps[k]([*own, *handed_grads]))
        return weights


def _stage_of(variable: Any, devices: Sequence[str]) -> int:
    where = placement.variable_device(variable)
    for k, device in enumerate(devices):
        if placement.within(where, device):
            return k
    raise ValueError(f"{variable.path} lives on {where}, on no stage's device")
