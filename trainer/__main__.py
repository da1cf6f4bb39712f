"""``python -m trainer``: parse flags, train, map expected errors to one line
and an exit code (see ``trainer/errors.py``)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from trainer.distribution.strategy import parse_tf_config
from trainer.errors import ClusterError, TrainerError
from trainer.flags import parse_args
from trainer.loop.progress import Progress

# Fewest inter-op threads a task of a distributed job gets.
MIN_INTER_OP_THREADS = 4


def ensure_inter_op_threads() -> None:
    """TensorFlow sizes its inter-op thread pool by the CPUs the process may
    run on: one on a 1-vCPU VM (n1-standard-1, or a task pinned to a core).
    A task of a distributed job then hangs for good: a blocking receive from
    another task holds the only thread that could run what it waits for.
    Idle threads cost nothing, so small machines get a few (before
    TensorFlow is imported; a value the user set wins)."""
    if len(os.sched_getaffinity(0)) < MIN_INTER_OP_THREADS:
        os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(MIN_INTER_OP_THREADS))


def use_pooling_cpu_allocator() -> None:
    """TensorFlow's CPU allocator is malloc by default. The tensors a step
    allocates (activations, parameters received from a ps, gradients to
    send: 3 to 13 MB for the CNN) are large enough for glibc to serve each
    with a fresh mmap, so every step pays a page fault per 4 KiB on first
    touch. Measured on an async worker: 27 % of its CPU time in the kernel,
    and async with one worker at 0.7x the speed of ``single``. TensorFlow's
    BFC allocator keeps freed memory for reuse (it never hands it back to
    the OS: a task holds its peak, which a training task reaches every step
    anyway). Before TensorFlow is imported; a value the user set wins."""
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")


def grow_gpu_memory() -> None:
    """TensorFlow takes nearly all of a GPU's memory when it starts. Tasks of
    one job that share a node (an async ps beside a worker, a chief beside a
    worker) would then leave each other nothing: each takes what it uses
    instead. Before TensorFlow is imported; a value the user set wins."""
    os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    # TensorFlow's C++ INFO/WARNING chatter would drown the progress lines;
    # a user who wants it sets the variable.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    ensure_inter_op_threads()
    use_pooling_cpu_allocator()
    grow_gpu_memory()
    try:
        is_chief = parse_tf_config(os.environ.get("TF_CONFIG")).is_chief
    except ClusterError:
        is_chief = True  # run() reports the error; say it on the protocol too
    progress = Progress(enabled=is_chief)
    try:
        from trainer.run import run

        run(config, progress)
    except TrainerError as e:
        progress.error(str(e))
        print(f"trainer: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except KeyboardInterrupt:
        progress.error("interrupted")
        print("trainer: error: interrupted", file=sys.stderr, flush=True)
        return 130
    return 0


def leave(code: int) -> NoReturn:
    """Exit without TensorFlow's teardown. Everything the run produced is
    written and flushed by now, but the teardown of a distributed runtime
    can block: a worker whose coordination-service leader (the chief) left
    first retries it until a heartbeat times out, about 30 s later."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    leave(main())
