"""Denoising autoencoder on overlapping image patches (source A; Xie, Xu &
Chen 2012).

Training examples are the windows of every training image (see
``trainer/data/patches.py``): a batch is cut from the images on demand and
corrupted with Gaussian or masking noise in the input pipeline; the network
(patch -> sigmoid hidden -> sigmoid patch) learns to output the clean patch.
Evaluation corrupts whole held-out test images, denoises each of their
patches, stitches the patches back (overlapping pixels averaged) and reports
mean per-image PSNR of corrupted and reconstructed images against the clean
ones, plus G/C/R sample images.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.data.inputs import index_batches, step_seed
from trainer.data.mnist import SIDE, Split
from trainer.data.patches import cut, extract, stitch, windows
from trainer.flags import Config
from trainer.models.base import Batch, Evaluation, Phase

L = keras.layers
SAMPLE_IMAGES = 8


def corrupt(x: tf.Tensor, kind: str, level: float, seed: tf.Tensor) -> tf.Tensor:
    """Gaussian: add N(0, level^2) noise and clip to [0, 1]; masking: zero a
    ``level`` fraction of the values."""
    if kind == "gaussian":
        noise = tf.random.stateless_normal(tf.shape(x), seed, stddev=level, dtype=x.dtype)
        return tf.clip_by_value(x + noise, 0.0, 1.0)
    keep = tf.random.stateless_uniform(tf.shape(x), seed, dtype=x.dtype) >= level
    return x * tf.cast(keep, x.dtype)


def psnr(mse: tf.Tensor) -> tf.Tensor:
    """PSNR in dB of images in [0, 1] with mean squared error ``mse``."""
    return 10.0 * tf.math.log(1.0 / tf.maximum(mse, 1e-10)) / tf.math.log(10.0)


def psnr_np(mse: np.ndarray) -> np.ndarray:
    return 10.0 * np.log10(1.0 / np.maximum(mse, 1e-10))


def squared_error(prediction: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
    """Per-example mean squared error."""
    return tf.reduce_mean(tf.square(prediction - target), axis=-1)


class DenoisingAutoencoder(keras.Model):
    def __init__(self, inputs: int, hidden: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.encoder = L.Dense(hidden, activation="sigmoid", name="encoder")
        self.decoder = L.Dense(inputs, activation="sigmoid", name="decoder")

    def call(self, x: tf.Tensor) -> tf.Tensor:
        return self.decoder(self.encoder(x))


class DenoisingTask:
    """The ``dae`` model; ``sdae`` changes only the network and the phases."""

    def __init__(self, config: Config) -> None:
        self.name = config.model
        # Its own options, declared in its catalog.py entry.
        self.patch: int = config.options["patch"]
        self.stride: int = config.options["stride"]
        self.noise: str = config.options["noise"]
        self.noise_level: float = config.options["noise_level"]
        self.hidden: int = config.options["hidden"]
        self.corners = windows(SIDE, SIDE, self.patch, self.stride)
        self.inputs = self.patch * self.patch

    def corrupt(self, x: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        return corrupt(x, self.noise, self.noise_level, seed)

    def new_model(self) -> keras.Model:
        return DenoisingAutoencoder(self.inputs, self.hidden, name=self.name)

    def example_input(self) -> tf.Tensor:
        return tf.zeros([1, self.inputs])

    def build_model(self) -> keras.Model:
        model = self.new_model()
        model(self.example_input())
        return model

    def phases(self, model: keras.Model, total_steps: int) -> list[Phase]:
        return [
            Phase(
                "train",
                0,
                total_steps,
                model.trainable_variables,
                self.reconstruction_loss(model),
                ("psnr",),
            )
        ]

    @staticmethod
    def reconstruction_loss(model: keras.Model) -> Any:
        def loss(batch: Batch) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
            per_example = squared_error(model(batch["noisy"]), batch["clean"])
            return per_example, {"psnr": psnr(tf.reduce_mean(per_example))}

        return loss

    def train_examples(self, num_images: int) -> int:
        return num_images * len(self.corners)

    def build_inputs(
        self, data_dir: str, batch_size: int, start_batch: int, key: tf.Tensor
    ) -> tf.data.Dataset:
        from trainer.data.mnist import read_split_tf

        images, _ = read_split_tf(data_dir, "train")
        corners = tf.constant(self.corners, tf.int32)
        per_image = len(self.corners)

        def cut_batch(item: dict[str, tf.Tensor]) -> Batch:
            index = item["index"]
            image = index // per_image
            corner = tf.gather(corners, tf.cast(index % per_image, tf.int32))
            clean = tf.cast(cut(images, image, corner, self.patch), tf.float32) / 255.0
            clean = tf.reshape(clean, [-1, self.inputs])
            noisy = self.corrupt(clean, step_seed(item["seed"], 1000))
            return {"clean": clean, "noisy": noisy, "seed": item["seed"]}

        stream = index_batches(tf.shape(images)[0] * per_image, batch_size, start_batch, key)
        return stream.map(cut_batch, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    def reconstruct(self, model: keras.Model, noisy: np.ndarray) -> np.ndarray:
        """Denoise whole images [N, 28, 28]: every window patch through the
        network, then stitched back with overlaps averaged."""
        patches = extract(noisy, self.corners, self.patch).reshape(-1, self.inputs)
        denoise = tf.function(model, reduce_retracing=True)
        out = np.concatenate(
            [
                denoise(tf.constant(patches[i : i + 8192])).numpy()
                for i in range(0, len(patches), 8192)
            ]
        )
        shaped = out.reshape(len(noisy), len(self.corners), self.patch, self.patch)
        return stitch(shaped, self.corners, SIDE, SIDE)

    def evaluate(self, model: keras.Model, test: Split, seed: int) -> Evaluation:
        clean = test.images.astype(np.float32) / 255.0
        noisy = self.corrupt(tf.constant(clean), tf.constant([seed, 20121203], tf.int64)).numpy()
        restored = self.reconstruct(model, noisy)

        def mean_psnr(images: np.ndarray) -> float:
            mse = ((images - clean) ** 2).reshape(len(clean), -1).mean(axis=1)
            return float(psnr_np(mse).mean())

        corrupted, reconstructed = mean_psnr(noisy), mean_psnr(restored)
        return Evaluation(
            results={
                "psnr_corrupted": corrupted,
                "psnr_reconstructed": reconstructed,
                "eval_images": float(len(clean)),
            },
            samples={
                "G": clean[:SAMPLE_IMAGES],
                "C": noisy[:SAMPLE_IMAGES],
                "R": restored[:SAMPLE_IMAGES],
            },
            titles={"C": f"{corrupted:.1f} dB", "R": f"{reconstructed:.1f} dB"},
        )

    def describe(self) -> dict[str, Any]:
        return {
            "patch": self.patch,
            "stride": self.stride,
            "patches_per_image": len(self.corners),
            "noise": self.noise,
            "noise_level": self.noise_level,
            "hidden": self.hidden,
        }


def create_task(config: Config) -> DenoisingTask:
    return DenoisingTask(config)
