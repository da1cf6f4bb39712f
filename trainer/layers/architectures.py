"""The built-in models' layers in plain Python: each layer's name, in the
order the model calls them, and its parameter count.

The Keras models (``trainer/models/``) name their layers from here, and
``--mode layers`` cuts this list into stages (``trainer/layers/stages.py``). Plain
Python, like the catalog, so that the launcher checks a ``--placement``
against the model's layer names, and chooses the default split, before any
task starts (TensorFlow is not imported there). ``tests/trainer/test_layers.py``
builds every model and compares its layers with these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# MNIST images: 28 x 28 pixels, one channel, ten classes.
SIDE = 28
CLASSES = 10


@dataclass(frozen=True)
class LayerSpec:
    """One layer of a model: its Keras name and its number of parameters
    (float32 each; 0 for a layer without weights, e.g. pooling)."""

    name: str
    params: int

    @property
    def bytes(self) -> int:
        return 4 * self.params


@dataclass(frozen=True)
class Architecture:
    convs: tuple[tuple[int, int, bool], ...]  # (filters, kernel, maxpool after)
    dense: tuple[int, ...]
    dropout: float


ARCHITECTURES = {
    "cnn": Architecture(convs=((32, 5, True), (64, 5, True)), dense=(1024,), dropout=0.5),
    "convnet": Architecture(
        convs=((64, 5, True), (256, 3, False), (512, 3, True)), dense=(2048, 1024), dropout=0.25
    ),
}


def _numbered(kind: str, seen: dict[str, int]) -> str:
    """Keras' own naming in a fresh model: conv2d, conv2d_1, conv2d_2..."""
    count = seen.get(kind, 0)
    seen[kind] = count + 1
    return kind if count == 0 else f"{kind}_{count}"


def classifier_layers(arch: Architecture) -> tuple[LayerSpec, ...]:
    """conv (SAME padding) and 2x2 max-pooling, flatten, dense layers each
    followed by dropout, then the 10 logits."""
    seen: dict[str, int] = {}
    layers: list[LayerSpec] = []
    side, channels = SIDE, 1
    for filters, kernel, pool in arch.convs:
        params = kernel * kernel * channels * filters + filters
        layers.append(LayerSpec(_numbered("conv2d", seen), params))
        channels = filters
        if pool:
            layers.append(LayerSpec(_numbered("max_pooling2d", seen), 0))
            side //= 2
    layers.append(LayerSpec(_numbered("flatten", seen), 0))
    width = side * side * channels
    for units in arch.dense:
        layers.append(LayerSpec(_numbered("dense", seen), width * units + units))
        layers.append(LayerSpec(_numbered("dropout", seen), 0))
        width = units
    layers.append(LayerSpec(_numbered("dense", seen), width * CLASSES + CLASSES))
    return tuple(layers)


def _dense(name: str, inputs: int, units: int) -> LayerSpec:
    return LayerSpec(name, inputs * units + units)


def dae_layers(options: Mapping[str, Any]) -> tuple[LayerSpec, ...]:
    """patch -> hidden -> patch."""
    inputs, hidden = options["patch"] ** 2, options["hidden"]
    return (_dense("encoder", inputs, hidden), _dense("decoder", hidden, inputs))


def sdae_width(options: Mapping[str, Any]) -> int:
    """The second hidden layer's width."""
    return max(1, round(options["hidden"] * options["width_factor"]))


def sdae_layers(options: Mapping[str, Any]) -> tuple[LayerSpec, ...]:
    """patch -> hidden -> wide -> hidden -> patch, in the order fine-tuning
    calls them."""
    inputs, hidden, wide = options["patch"] ** 2, options["hidden"], sdae_width(options)
    return (
        _dense("encoder1", inputs, hidden),
        _dense("encoder2", hidden, wide),
        _dense("decoder2", wide, hidden),
        _dense("decoder1", hidden, inputs),
    )
