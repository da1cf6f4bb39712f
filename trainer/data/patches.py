"""Overlapping image patches as index windows.

Only each window's top-left corner is stored (a few dozen (y, x) pairs for
all images alike); patch ``w`` of a training set is window ``w % M`` of image
``w // M``. Batches are cut on demand by one gather from the images, so the
N*M patches never exist in memory at once. Reconstruction puts patches back
at their windows and divides each pixel by the number of windows covering
it: overlapping pixels are averaged exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import tensorflow as tf


def starts(size: int, patch: int, stride: int) -> np.ndarray:
    """Window starts along one axis, every ``stride`` pixels, plus a last one
    flush with the edge when the stride does not land there, so every pixel
    is covered."""
    if patch > size:
        raise ValueError(f"patch {patch} is larger than the image side {size}")
    positions = list(range(0, size - patch + 1, stride))
    if positions[-1] != size - patch:
        positions.append(size - patch)
    return np.asarray(positions, dtype=np.int32)


def windows(height: int, width: int, patch: int, stride: int) -> np.ndarray:
    """Top-left corners [M, 2] (y, x) of the windows of one image, row-major."""
    ys, xs = starts(height, patch, stride), starts(width, patch, stride)
    return np.stack(np.meshgrid(ys, xs, indexing="ij"), axis=-1).reshape(-1, 2)


def cut(images: tf.Tensor, image_index: tf.Tensor, corners: tf.Tensor, patch: int) -> tf.Tensor:
    """Patches [B, patch, patch] of ``images`` [N, H, W] at ``corners`` [B, 2]
    of images ``image_index`` [B]: one gather of B*patch*patch pixels."""
    import tensorflow as tf

    offsets = tf.range(patch, dtype=tf.int32)
    rows = corners[:, 0:1] + offsets  # [B, patch]
    cols = corners[:, 1:2] + offsets  # [B, patch]
    shape = tf.shape(images)
    height, width = shape[1], shape[2]
    image = tf.cast(image_index, tf.int32)[:, None, None]
    flat = (image * height + rows[:, :, None]) * width + cols[:, None, :]  # [B, patch, patch]
    return tf.gather(tf.reshape(images, [-1]), flat)


def extract(images: np.ndarray, corners: np.ndarray, patch: int) -> np.ndarray:
    """All window patches of ``images`` [N, H, W] as [N, M, patch, patch]
    (evaluation: a few test images, where all their patches are needed)."""
    return np.stack([images[:, y : y + patch, x : x + patch] for y, x in corners], axis=1)


def stitch(patches: np.ndarray, corners: np.ndarray, height: int, width: int) -> np.ndarray:
    """Images [N, H, W] from their window patches [N, M, p, p]: each pixel is
    the mean of the patch pixels covering it."""
    count, _, patch, _ = patches.shape
    total = np.zeros((count, height, width), dtype=np.float64)
    covered = np.zeros((height, width), dtype=np.float64)
    for m, (y, x) in enumerate(corners):
        total[:, y : y + patch, x : x + patch] += patches[:, m]
        covered[y : y + patch, x : x + patch] += 1
    if not covered.all():
        raise ValueError("the windows leave pixels uncovered")
    return (total / covered).astype(patches.dtype)
