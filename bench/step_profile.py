"""Where an async step's time goes: compute, transfers, the ps's update,
scheduling; measured on a local job of 1 ps + 1 worker + the chief,
pinned as bench/trainer.py pins them (the worker on a core of its own; the
ps and the chief on the last core).

The chief (this program under TF_CONFIG) builds the trainer's own state
(``Training.build_state``: the cnn, its Adam, the global step, on the ps)
and times, per step, each a ``tf.function`` of ``--per-call`` steps that
the coordinator schedules on the worker, as the trainer's async loop does:

* ``step``: the trainer's step (``AsyncMode.calls``): everything;
* ``compute``: forward and backward pass on values already on the worker;
* ``read``: the parameters' values read from the ps (``read_values``);
* ``push_apply``: gradients (made on the worker) given to the optimizer:
  their transfer to the ps and the update wherever Keras places it;
* ``apply_on_ps``: the same update run by the chief as a function placed
  on the ps with the gradients there: the update alone, no transfer;
  ``apply_on_ps_keras_adam``: the same with Keras 3's own Adam (what the
  trainer used before ``trainer/optimizers.FusedAdam``), in the same run;
* ``schedule``: a closure that does nothing, per step of a call (the
  chief's and the coordinator's overhead).

Usage: ``python bench/step_profile.py [--per-call N] [--calls N] [--json-only]
[trainer flags after --, e.g. -- --jit]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RESULT = "@profile "


def timed(run: Callable[[], Any], repeat: int, join: Callable[[], None]) -> float:
    """Seconds per call of ``run`` (after one untimed call: tracing)."""
    run()
    join()
    began = time.perf_counter()
    for _ in range(repeat):
        run()
    join()
    return (time.perf_counter() - began) / repeat


def chief(args: argparse.Namespace) -> None:
    """Build the trainer's async state and time each part of a step."""
    import keras
    import tensorflow as tf

    from trainer import catalog
    from trainer.distribution import strategy as distribute
    from trainer.flags import parse_args
    from trainer.loop.progress import Progress
    from trainer.loop.steps import gradient_fn, read_values
    from trainer.models import create_task
    from trainer.training import Training

    info = distribute.parse_tf_config(os.environ.get("TF_CONFIG"))
    distribute.wait_for_servers(info, 120)
    strategy = distribute.create_strategy(catalog.PARAMETER_SERVER)
    config = parse_args(["--mode", "async", "--steps", "1000", "--data-dir", args.data_dir,
                         "--output-dir", tempfile.mkdtemp(), *args.trainer_flags])  # fmt: skip
    training = Training(config, info, strategy, Progress(enabled=False), Path(args.data_dir))
    task = create_task(config)
    state = training.build_state(task, 1000)
    mode = training.mode
    coordinator = mode.coordinator  # type: ignore[attr-defined]
    iterator = mode.input_iterator(task, Path(args.data_dir), 0)
    phase, optimizer = state.phases[0], state.optimizers[0]
    variables = state.model.variables
    k = tf.constant(args.per_call, tf.int64)
    limit = tf.constant(10**9, tf.int64)
    call = mode.calls(phase, optimizer, state)
    compute = gradient_fn(phase, variables, config.jit)
    one = tf.constant(1.0)

    def replica(fn: Callable[..., Any], *fargs: Any) -> Any:
        """``fn`` in the worker's replica context (the one replica's result)."""
        return strategy.experimental_local_results(strategy.run(fn, args=fargs))[0]

    def forward_backward(values: list[Any], batch: Any) -> Any:
        loss, grads, _ = compute(values, batch, one)
        return loss + tf.add_n([tf.reduce_sum(g) for g in grads]) * 0.0

    @tf.function
    def compute_only(iterator: Any) -> Any:
        values = read_values(variables)
        total = tf.constant(0.0)
        for _ in tf.range(args.per_call):
            total += replica(forward_backward, values, next(iterator))
        return total

    @tf.function
    def read_only() -> Any:
        total = tf.constant(0.0)
        for _ in tf.range(args.per_call):
            total += tf.add_n([tf.reduce_sum(v) for v in read_values(variables)])
        return total

    def fake_grads() -> list[Any]:
        # Made where the function runs: filled with a random scalar, which
        # is not constant-folded and costs one pass (a random tensor of 3.3
        # million numbers would cost more than the update).
        return [tf.fill(v.shape, tf.random.uniform([], maxval=1e-9)) for v in phase.variables]

    def apply() -> Any:
        optimizer.apply(fake_grads(), phase.variables)
        return tf.constant(0)

    @tf.function
    def push_apply() -> Any:
        for _ in tf.range(args.per_call):
            replica(apply)
        return tf.constant(0)

    with strategy.scope():
        keras_adam = keras.optimizers.Adam(config.learning_rate)
        keras_adam.build(list(phase.variables))

    def on_ps(optimizer: Any) -> Callable[[], Any]:
        @tf.function
        def apply_on_ps() -> Any:
            with tf.device("/job:ps/replica:0/task:0/device:CPU:0"):
                for _ in tf.range(args.per_call):
                    optimizer.apply(fake_grads(), phase.variables)
            return tf.constant(0)

        return apply_on_ps

    @tf.function
    def nothing() -> Any:
        return tf.constant(0)

    def scheduled(fn: Callable[..., Any], *fargs: Any) -> Callable[[], Any]:
        return lambda: coordinator.schedule(fn, args=fargs)

    join = coordinator.join
    seconds = {
        "step": timed(scheduled(call, iterator, k, limit), args.calls, join),
        "compute": timed(scheduled(compute_only, iterator), args.calls, join),
        "read": timed(scheduled(read_only), args.calls, join),
        "push_apply": timed(scheduled(push_apply), args.calls, join),
        "apply_on_ps": timed(on_ps(optimizer), args.calls, lambda: None),
        "apply_on_ps_keras_adam": timed(on_ps(keras_adam), args.calls, lambda: None),
        "schedule": timed(scheduled(nothing), args.calls * 4, join),
    }
    per_step = {name: s / args.per_call for name, s in seconds.items()}
    per_step["schedule"] = seconds["schedule"] / args.per_call
    print(RESULT + json.dumps({"per_step_ms": {k: v * 1e3 for k, v in per_step.items()}}),
          flush=True)  # fmt: skip
    os._exit(0)


def launch(args: argparse.Namespace) -> dict[str, Any]:
    """This program on a local job of 1 ps + 1 worker + the chief."""
    from bench.support.loopback import LocalJob
    from bench.trainer import placement

    argv = ["--task", "--per-call", str(args.per_call), "--calls", str(args.calls),
            "--data-dir", args.data_dir, "--", *args.trainer_flags]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        job = LocalJob(mode="async", argv=argv, log_dir=Path(tmp), workers=1, ps=1,
                       cpus=placement("async", 1, 1) if args.pin else {},
                       program=[__file__])  # fmt: skip
        load = os.getloadavg()[0]
        try:
            job.start()
            if job.wait(900) != 0:
                raise RuntimeError(f"the profile failed\n{job.logs()}")
        finally:
            job.stop()
        lines = [x for x in job.log().splitlines() if x.startswith(RESULT)]
        if not lines:
            raise RuntimeError(f"no result\n{job.logs()}")
    found: dict[str, Any] = json.loads(lines[-1][len(RESULT) :])
    found.update(
        per_call=args.per_call,
        trainer_flags=args.trainer_flags,
        load=[load, os.getloadavg()[0]],
        pinned=args.pin,
    )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-call", type=int, default=10, help="steps per scheduled function")
    parser.add_argument("--calls", type=int, default=5, help="timed calls of each")
    parser.add_argument("--data-dir", default=os.environ.get("MNIST_DIR"))
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument("--task", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=len(os.sched_getaffinity(0)) >= 2,
        help="the worker on a core of its own, as bench/trainer.py pins",
    )
    parser.add_argument("trainer_flags", nargs="*", help="trainer flags (after --)")
    args = parser.parse_args()
    # As the trainer does for itself before TensorFlow is imported.
    from trainer.__main__ import ensure_inter_op_threads, use_pooling_cpu_allocator

    ensure_inter_op_threads()
    use_pooling_cpu_allocator()
    if args.task:
        from trainer.distribution import strategy as distribute

        info = distribute.parse_tf_config(os.environ.get("TF_CONFIG"))
        if distribute.serves_only(info, "async"):
            distribute.serve(info)
        chief(args)
        return 0
    from trainer.data.mnist import resolve_data_dir

    args.data_dir = str(resolve_data_dir(args.data_dir))
    found = launch(args)
    if not args.json_only:
        for name, ms in found["per_step_ms"].items():
            print(f"{name:<12}{ms:>9.1f} ms per step")
        print(f"load average {found['load'][0]:.1f} -> {found['load'][1]:.1f}")
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
