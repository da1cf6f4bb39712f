"""``--mode layers`` on the TensorFlow side: a model built with each layer's
variables, and its computation, on the device of its stage.

A layer is pinned by giving it a ``__call__`` that enters ``tf.device`` of
its stage first (its class swapped in place for a subclass, as
``steps.count_atomically`` does with the optimizer's counter). Everything
the layer does then happens there: building its variables (on the first
call, eager: ``build_placed`` calls the model's ``call`` itself, since
Keras' own first call of a model builds its layers symbolically and only
creates the variables afterwards, outside any device scope), and every
forward computation after. Gradients follow their operations
(``tf.gradients`` colocates each gradient with its op: ``trainer/modes/pipeline.py``),
Adam's slots follow their variable (Keras creates them colocated), and
``PlacedAdam`` computes each update where its variable lives.

What summary.json says about the placement is read back from the
variables (``read_placement``), never from the plan.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import keras
import tensorflow as tf

from trainer.errors import UsageError

# Layer classes already given a placed subclass.
_PLACED: dict[type, type] = {}
# The attribute a placed layer keeps its stage in: (stage index, device).
STAGE_ATTR = "_tfcluster_stage"


class LayeredTask(Protocol):
    """A task whose model can be built layer by layer where they go."""

    name: str

    def new_model(self) -> keras.Model:
        """The model, its layers made, no variable created yet."""
        ...

    def example_input(self) -> tf.Tensor:
        """An input of one example, to build the model with."""
        ...


class CallRecorder(Protocol):
    """Told of every placed layer's call while a step is traced
    (``trainer/modes/pipeline.py`` times the stages from these)."""

    def enter(self, stage: int, args: tuple[Any, ...]) -> tuple[Any, ...]: ...

    def leave(self, stage: int, outputs: Any) -> None: ...


_recorder: list[CallRecorder] = []


@contextlib.contextmanager
def recording(recorder: CallRecorder) -> Iterator[CallRecorder]:
    """While tracing: placed layers report their calls to ``recorder``."""
    _recorder.append(recorder)
    try:
        yield recorder
    finally:
        _recorder.pop()


def _placed_class(cls: type) -> type:
    if cls not in _PLACED:

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            stage, device = getattr(self, STAGE_ATTR)
            with tf.device(device):
                if _recorder:
                    args = _recorder[-1].enter(stage, args)
                outputs = cls.__call__(self, *args, **kwargs)
                if _recorder:
                    _recorder[-1].leave(stage, outputs)
                return outputs

        _PLACED[cls] = type(f"Placed{cls.__name__}", (cls,), {"__call__": __call__})
    return _PLACED[cls]


def place(layer: keras.Layer, stage: int, device: str) -> None:
    """Run ``layer`` (its build and every call) on ``device``, as stage ``stage``."""
    # Keras tracks what is set on a layer: the stage is set past it.
    object.__setattr__(layer, STAGE_ATTR, (stage, device))
    if type(layer) not in _PLACED.values():
        layer.__class__ = _placed_class(type(layer))


def build_placed(
    task: LayeredTask, stage_of: Mapping[str, int], devices: list[str]
) -> keras.Model:
    """The task's model, each layer named in ``stage_of`` on the device of
    its stage, every variable created there (checked)."""
    model = task.new_model()
    layers = {layer.name: layer for layer in model.layers}
    if set(layers) != set(stage_of):
        raise UsageError(
            f"{task.name}: its layers ({', '.join(layers)}) are not the ones listed for it "
            f"({', '.join(stage_of)}) in trainer/layers/architectures.py"
        )
    for name, layer in layers.items():
        place(layer, stage_of[name], devices[stage_of[name]])
    example = task.example_input()
    model.call(example)  # eager: each layer builds under its device scope
    model(example)  # Keras' own first call: nothing left to create
    for name, layer in layers.items():
        for variable in layer.variables:
            where = variable_device(variable)
            if not within(where, devices[stage_of[name]]):
                raise UsageError(
                    f"{variable.path} was created on {where}, not on its stage's "
                    f"{devices[stage_of[name]]}: the layer builds its weights outside "
                    "its first call"
                )
    return model


def within(device: str, wanted: str) -> bool:
    """Whether ``device`` is (on) ``wanted``: the same task and, where
    ``wanted`` names one, the same device."""
    have, want = tf.DeviceSpec.from_string(device), tf.DeviceSpec.from_string(wanted)
    fields = ("job", "replica", "task", "device_type", "device_index")
    return all(getattr(want, f) in (None, getattr(have, f)) for f in fields)


def variable_device(variable: Any) -> str:
    """The device a Keras (or TensorFlow) variable lives on."""
    value = getattr(variable, "value", variable)
    return str(value.device)


def read_placement(model: keras.Model) -> dict[str, str]:
    """Every model variable's Keras path -> the device it lives on, read
    from the variables themselves."""
    return {v.path: variable_device(v) for v in model.variables}


def bytes_per_device(variables: Iterable[Any]) -> dict[str, int]:
    """Bytes of ``variables`` on each device."""
    found: dict[str, int] = {}
    for v in variables:
        size = int(tf.size(v).numpy()) * tf.as_dtype(v.dtype).size
        found[variable_device(v)] = found.get(variable_device(v), 0) + size
    return found


class PlacedAdam(keras.optimizers.Adam):
    """Adam whose update of a variable is computed on that variable's
    device. Keras leaves an update's arithmetic unplaced: inside a function
    it would run on the chief, which would then read every slot from its
    stage and write it back each step."""

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> Any:
        with tf.device(variable.device):
            return super().update_step(gradient, variable, learning_rate)


def split_cpu(count: int) -> None:
    """This process's CPU as ``count`` logical devices (before TensorFlow's
    runtime starts): stages on one machine without GPUs."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
    )


def _gpu_kernel(op_type: str) -> bool:
    from tensorflow.python.framework import kernels

    registered = kernels.get_registered_kernels_for_op(op_type).kernel
    return any(kernel.device_type == "GPU" for kernel in registered)


def cpu_fallbacks(
    graphs: Iterable[tf.Graph], has_gpu_kernel: Callable[[str], bool] = _gpu_kernel
) -> list[str]:
    """The types of the operations placed on a GPU that have no GPU kernel:
    soft placement runs them on the CPU instead (sorted, each once)."""
    found = set()
    for graph in graphs:
        for op in graph.get_operations():
            if "GPU" in op.device.upper() and not has_gpu_kernel(op.type):
                found.add(op.type)
    return sorted(found)
