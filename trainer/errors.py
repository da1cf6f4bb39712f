"""The one exception root of the trainer and its small, documented subclasses.

``python -m trainer`` prints ``trainer: error: <message>`` (one line, no
traceback) for any of these and exits with the class's ``exit_code``; on the
chief it also emits an ``error`` progress event first, so ``deploy.py train``
can show why the job ended. Anything else escaping is a bug and keeps its
traceback. Bad flags never get here: argparse rejects them with exit code 2.
"""

from __future__ import annotations


class TrainerError(Exception):
    """Root of every expected trainer failure. Exit code 1."""

    exit_code = 1


class UsageError(TrainerError):
    """A flag combination only found wrong once the data is known (for example
    sdae pretraining that leaves no fine-tuning steps). Exit code 2, like
    argparse's own flag errors."""

    exit_code = 2


class ClusterError(TrainerError):
    """TF_CONFIG is malformed, does not fit ``--mode`` (for example async
    without a ps), or a peer task became unreachable during training.
    Exit code 3."""

    exit_code = 3


class DataError(TrainerError):
    """MNIST is missing, corrupted (checksum or IDX header mismatch), or
    cannot be downloaded (offline). Exit code 4."""

    exit_code = 4


class CheckpointError(TrainerError):
    """``--resume`` found nothing to resume, or a checkpoint does not match
    the model being trained. Exit code 5."""

    exit_code = 5


class TrainingFailed(TrainerError):
    """Training itself went wrong: the loss became NaN or infinite.
    Exit code 6."""

    exit_code = 6


class NoGpu(TrainerError):
    """The job was asked to run on a GPU (``--require-gpu``, or
    ``$TFCLUSTER_REQUIRE_GPU`` on a node with an accelerator) and TensorFlow
    sees none: a CPU-only TensorFlow build, a missing or broken driver, or
    ``CUDA_VISIBLE_DEVICES`` hiding them. Refused instead of training for
    hours on the CPU. Exit code 7."""

    exit_code = 7
