"""``--mode layers``: model parallelism, each worker task holding a block
of consecutive layers of one model.

The workers only serve (``tf.distribute.Server``); the chief connects to
them (``distribute.connect_to_cluster``) and builds the model with each
stage's layers on its task (``trainer/modes/placement.py``): their variables and
Adam's slots live there, their forward and backward computation runs
there, and only activations and their gradients cross between tasks, over
gRPC (``trainer/modes/pipeline.py``, with ``--micro-batches`` pipelined GPipe
style). ``trainer/layers/stages.py`` decides the split: one stage per worker,
cut where the largest holds the fewest parameter bytes, or ``--stages``,
or ``--placement``. With ``--devices gpu`` (``cpu``) the stages go to this
node's GPUs (its CPU split into logical devices) instead of to tasks.

Checkpoints are written and read by the chief (``checkpoint_options``):
they hold each variable by its place in the model, not by its device, so
a checkpoint restores into any split, another number of stages included.
A worker lost mid-job ends the job with one line naming it and the stage
it held (``lost``); ``--resume`` goes on from the last checkpoint.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from trainer import catalog
from trainer.distribution import strategy as distribute
from trainer.distribution.strategy import ClusterInfo
from trainer.errors import ClusterError, NoGpu, UsageError
from trainer.flags import Config
from trainer.layers import stages
from trainer.loop.loops import Monitor, PhaseRun
from trainer.loop.schedules import LearningRate
from trainer.models.base import Phase, Task
from trainer.modes import placement
from trainer.modes.base import Call, TrainingMode
from trainer.modes.pipeline import PipelineStep, StageTiming

if TYPE_CHECKING:
    from trainer.loop.checkpoints import State

# What a lost task raises in the middle of a step.
LOST = (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError)
DEFAULT_CPU_STAGES = 2


class LayersMode(TrainingMode):
    def __init__(
        self,
        entry: catalog.Mode,
        config: Config,
        info: ClusterInfo,
        strategy: tf.distribute.Strategy,
    ) -> None:
        super().__init__(entry, config, info, strategy)
        options = config.options
        self.kind: str = options["devices"]
        self.pieces: int = options["micro_batches"]
        if config.batch_size % self.pieces:
            raise UsageError(
                f"--micro-batches {self.pieces} does not divide --batch-size {config.batch_size}"
            )
        layers = catalog.model(config.model).layers
        if layers is None:
            raise UsageError(f"--mode layers: {config.model} has no list of layers to split")
        slot_devices = self._slot_devices()
        slots = stages.slots_for(self.kind, len(slot_devices))
        try:
            self.plan = stages.plan(
                config.model,
                layers(options),
                slots,
                stages=options["stages"],
                placement=options["placement"],
            )
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.slot_word = slots.word
        self.devices = [slot_devices[stage.slot] for stage in self.plan.stages]
        self.timing = StageTiming(len(self.devices))
        self.steps: list[PipelineStep] = []
        self.model: keras.Model | None = None
        if info.is_chief:
            print(f"trainer: layers: {self.plan.describe(self.slot_word)}", flush=True)
            if config.jit:
                print("trainer: layers: --jit is not used: XLA compiles one device", flush=True)

    def _slot_devices(self) -> list[str]:
        """The devices stages can go to, slot by slot."""
        if self.kind == "tasks":
            workers = self.info.count("worker")
            if not workers:
                raise UsageError(
                    "--mode layers needs worker tasks in TF_CONFIG, or --devices gpu (cpu) "
                    "to place the stages on this machine's devices"
                )
            return [f"/job:worker/replica:0/task:{i}" for i in range(workers)]
        # This process's own devices: connected to a cluster, TensorFlow
        # lists the other tasks' too.
        here = tf.DeviceSpec(job=self.info.task_type, task=self.info.task_index)
        found = [
            d.name
            for d in tf.config.list_logical_devices(self.kind.upper())
            if tf.DeviceSpec.from_string(d.name).job in (None, "localhost")
            or placement.within(d.name, here.to_string())
        ]
        if not found:
            raise NoGpu(f"--devices {self.kind}: TensorFlow sees no {self.kind.upper()} here")
        return found

    @classmethod
    def configure_devices(cls, config: Config) -> None:
        # An operation without a kernel for its stage's GPU runs on the CPU
        # (the summary lists them).
        tf.config.set_soft_device_placement(True)
        options = config.options
        if options["devices"] == "cpu":
            count = options["stages"] or DEFAULT_CPU_STAGES
            if options["placement"]:
                try:
                    count = 1 + max(s for _, s in stages.parse_placement(options["placement"]))
                except ValueError as e:
                    raise UsageError(str(e)) from None
            placement.split_cpu(count)

    @property
    def examples_per_step(self) -> int:
        return self.config.batch_size

    def build_model(self, task: Task) -> keras.Model:
        if not hasattr(task, "new_model"):
            raise UsageError(f"--mode layers: {task.name} cannot be built layer by layer")
        stage_of = {name: k for k, stage in enumerate(self.plan.stages) for name in stage.layers}
        self.model = placement.build_placed(task, stage_of, self.devices)  # type: ignore[arg-type]
        return self.model

    def optimizer(self, learning_rate: LearningRate) -> keras.optimizers.Optimizer:
        return placement.PlacedAdam(learning_rate, name="adam")

    def checkpoint_options(self) -> tf.train.CheckpointOptions | None:
        if not self.info.cluster:
            return None
        chief = f"/job:{self.info.task_type}/replica:0/task:{self.info.task_index}/device:CPU:0"
        return tf.train.CheckpointOptions(experimental_io_device=chief)

    def calls(self, phase: Phase, optimizer: keras.optimizers.Optimizer, state: State) -> Call:
        step = PipelineStep(
            phase, optimizer, state.model.variables, state.step, self.devices, self.pieces,
            self.timing,
        )  # fmt: skip
        self.steps.append(step)
        return step

    def loop(
        self, runs: list[PhaseRun], iterator: Any, monitor: Monitor, step: tf.Variable, start: int
    ) -> int:
        try:
            return super().loop(runs, iterator, monitor, step, start)
        except LOST as e:
            raise self.lost(e, monitor.checkpoints.last_saved_step) from None

    def lost(self, error: Exception, checkpoint: int | None) -> ClusterError:
        """One line: which task the job lost, which stage it held, and
        where ``--resume`` goes on from."""
        addresses = self.info.cluster.get("worker", ())
        gone = [i for i, address in enumerate(addresses) if not distribute.listens(address)]
        if not gone:  # still listening (a restarted process): as the error says
            named = re.findall(r"/job:worker/replica:\d+/task:(\d+)", str(error))
            gone = sorted({int(i) for i in named})
        held = {stage.slot: (k, stage) for k, stage in enumerate(self.plan.stages)}
        parts = []
        for slot in gone:
            where = f"worker {slot}"
            if slot < len(addresses):
                where += f" ({addresses[slot]})"
            if slot in held:
                k, stage = held[slot]
                where += f", which held stage {k + 1} of {len(self.plan.stages)} ({stage.span})"
            parts.append(where)
        lost = "; ".join(parts) or f"a task ({_first_line(error)})"
        then = (
            f"`--resume` goes on from the last checkpoint (step {checkpoint})"
            if checkpoint
            else "no checkpoint was written yet: start the job again"
        )
        return ClusterError(f"lost {lost}: {then}")

    def summary(self) -> dict[str, Any]:
        assert self.model is not None
        count, pieces = len(self.devices), self.pieces
        found: dict[str, Any] = {
            "stage_devices": self.kind,
            "stages": [
                {"device": device, "layers": list(stage.layers), "param_bytes": stage.bytes}
                for device, stage in zip(self.devices, self.plan.stages, strict=True)
            ],
            "split": self.plan.how,
            "placement": placement.read_placement(self.model),
            "params_per_device": placement.bytes_per_device(self.model.variables),
            "micro_batches": pieces,
            # GPipe's bubble for equal stages, to read the measured one against.
            "gpipe_bubble": round((count - 1) / (pieces + count - 1), 4),
            **self.timing.summary(),
        }
        if self.kind == "gpu":
            found["cpu_fallback_ops"] = placement.cpu_fallbacks(
                step.graph for step in self.steps if step.graph is not None
            )
        return found


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


MODE = LayersMode
