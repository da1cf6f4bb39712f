"""Stacked denoising autoencoder: greedy layer-wise pretraining, then joint
fine-tuning (the part source A could not run distributed).

Layer 1 (patch -> h1 -> patch) is pretrained as a plain DAE; layer 2
(h1 -> h2 -> h1, h2 = width_factor * h1) is pretrained as a DAE on layer 1's
codes of clean patches, with layer 1 frozen; fine-tuning then trains the
whole stack noisy patch -> h1 -> h2 -> h1 -> patch against the clean patch.

Source A failed because its TF 1.x graph created layer 2's variables only
when layer 2's training began, by which time the distributed graph already
existed. Here every variable of every phase, and every phase's optimizer
slots, is created up front under the strategy's scope (``build_model`` calls
the full stack once; the loop builds each phase's optimizer before
training), so the phases only switch which variables a step updates.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from trainer.data.inputs import step_seed
from trainer.errors import UsageError
from trainer.flags import Config
from trainer.layers.architectures import sdae_width
from trainer.models.base import Batch, Phase
from trainer.models.dae import DenoisingTask, psnr, squared_error

L = keras.layers


class StackedDenoisingAutoencoder(keras.Model):
    def __init__(self, inputs: int, hidden: int, wide: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # In the order fine-tuning calls them (trainer/layers/architectures.py).
        self.encoder1 = L.Dense(hidden, activation="sigmoid", name="encoder1")
        self.encoder2 = L.Dense(wide, activation="sigmoid", name="encoder2")
        self.decoder2 = L.Dense(hidden, activation="sigmoid", name="decoder2")
        self.decoder1 = L.Dense(inputs, activation="sigmoid", name="decoder1")

    def call(self, x: tf.Tensor) -> tf.Tensor:
        return self.decoder1(self.decoder2(self.encoder2(self.encoder1(x))))


class StackedDenoisingTask(DenoisingTask):
    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.wide = sdae_width(config.options)
        self.pretrain_steps = config.options["pretrain_steps"]

    def new_model(self) -> keras.Model:
        return StackedDenoisingAutoencoder(self.inputs, self.hidden, self.wide, name=self.name)

    def build_model(self) -> keras.Model:
        model = self.new_model()
        model(self.example_input())  # all four layers' variables, now
        return model

    def phases(self, model: keras.Model, total_steps: int) -> list[Phase]:
        pretrain = self.pretrain_steps or max(1, total_steps // 4)
        if 2 * pretrain >= total_steps:
            raise UsageError(
                f"sdae: pretraining 2 x {pretrain} steps leaves no fine-tuning in {total_steps} "
                "steps; lower --pretrain-steps or raise --steps"
            )
        m: Any = model

        def layer1(batch: Batch) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
            restored = m.decoder1(m.encoder1(batch["noisy"]))
            per_example = squared_error(restored, batch["clean"])
            return per_example, {"psnr": psnr(tf.reduce_mean(per_example))}

        def layer2(batch: Batch) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
            code = m.encoder1(batch["clean"])
            noisy_code = self.corrupt(code, step_seed(batch["seed"], 2000))
            per_example = squared_error(m.decoder2(m.encoder2(noisy_code)), code)
            return per_example, {"mse": tf.reduce_mean(per_example)}

        def weights(*layers: keras.Layer) -> list[keras.Variable]:
            return [v for layer in layers for v in layer.trainable_variables]

        return [
            Phase(
                "pretrain-layer-1", 0, pretrain, weights(m.encoder1, m.decoder1), layer1, ("psnr",)
            ),
            Phase(
                "pretrain-layer-2",
                pretrain,
                2 * pretrain,
                weights(m.encoder2, m.decoder2),
                layer2,
                ("mse",),
            ),
            Phase(
                "finetune",
                2 * pretrain,
                total_steps,
                model.trainable_variables,
                self.reconstruction_loss(model),
                ("psnr",),
            ),
        ]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "hidden2": self.wide}


def create_task(config: Config) -> StackedDenoisingTask:
    return StackedDenoisingTask(config)
