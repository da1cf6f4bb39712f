"""A parameter-server program, written as TensorFlow's guide writes one.

Every task runs this same file with its own TF_CONFIG: the ps and worker
tasks start a gRPC server and serve until they are stopped; the chief
builds a ParameterServerStrategy (the variables live on the ps), schedules
training steps onto the workers with a ClusterCoordinator, and writes what
it learned into $TFCLUSTER_RUN_DIR, the folder that comes home.

It fits y = 3x + 2 from noisy samples, so the result is easy to check:
result.json's `w` and `b` end near 3 and 2.

    deploy.py run -- python ps_program.py --steps 300

It checkpoints into $TFCLUSTER_RUN_DIR/checkpoints every --checkpoint-every
steps, and with TFCLUSTER_RESUME=1 (what `deploy.py run` sets when it
restarts the job after a preempted node came back) it restores the latest
one and runs only the steps left.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import tensorflow as tf

TRUE_W, TRUE_B = 3.0, 2.0
LEARNING_RATE = 0.1


def serve(resolver: tf.distribute.cluster_resolver.TFConfigClusterResolver) -> None:
    """A ps or worker: serve the chief until stopped."""
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    print(f"{resolver.task_type}-{resolver.task_id} serving", flush=True)
    server.join()


def resume(manager: tf.train.CheckpointManager, done: tf.Variable) -> int:
    """With TFCLUSTER_RESUME=1, restore the latest checkpoint: the step it
    resumes from (0 without one)."""
    if os.environ.get("TFCLUSTER_RESUME") == "1" and manager.latest_checkpoint:
        manager.checkpoint.restore(manager.latest_checkpoint)
        resumed_from = int(done.numpy())
        print(f"resumed from step {resumed_from}", flush=True)
        return resumed_from
    return 0


def train(
    resolver: tf.distribute.cluster_resolver.TFConfigClusterResolver,
    steps: int,
    *,
    out: str,
    every: int,
    pause: float,
) -> dict:
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w = tf.Variable(0.0, name="w")
        b = tf.Variable(0.0, name="b")
        done = tf.Variable(0, dtype=tf.int64, name="steps_done")

    @tf.function
    def step() -> tf.Tensor:
        # x centred on 0 keeps w's and b's gradients apart, and a modest
        # rate keeps the descent steady although the workers update the
        # variables asynchronously, each from values a few steps old (at
        # 0.5 on x in [0, 1] a run could end 0.1 off).
        x = tf.random.uniform([64], -1.0, 1.0)
        y = TRUE_W * x + TRUE_B + tf.random.normal([64], stddev=0.05)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(w * x + b - y))
        grad_w, grad_b = tape.gradient(loss, [w, b])
        w.assign_sub(LEARNING_RATE * grad_w)
        b.assign_sub(LEARNING_RATE * grad_b)
        done.assign_add(1)
        return loss

    # The chief (the coordinator) saves the variables, wherever they live.
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(w=w, b=b, steps_done=done),
        os.path.join(out, "checkpoints"),
        max_to_keep=2,
    )
    resumed_from = resume(manager, done)

    began = time.monotonic()
    loss = None
    while int(done.numpy()) < steps:
        chunk = min(every, steps - int(done.numpy()))
        losses = [coordinator.schedule(step) for _ in range(chunk)]
        coordinator.join()
        loss = losses[-1]
        manager.save()
        print(f"checkpoint at step {int(done.numpy())}", flush=True)
        if pause and int(done.numpy()) < steps:
            time.sleep(pause)
    cluster = resolver.cluster_spec().as_dict()
    return {
        "w": float(w.numpy()),
        "b": float(b.numpy()),
        "steps": int(done.numpy()),
        "resumed_from_step": resumed_from,
        "final_loss": float(loss.fetch()) if loss is not None else None,
        "seconds": round(time.monotonic() - began, 2),
        "cluster": {kind: len(addresses) for kind, addresses in cluster.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument(
        "--pause", type=float, default=0.0, help="seconds to wait after each checkpoint (demos)"
    )
    args = parser.parse_args()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("ps", "worker"):
        serve(resolver)
        return
    out = os.environ.get("TFCLUSTER_RUN_DIR", ".")
    result = train(
        resolver, args.steps, out=out, every=max(1, args.checkpoint_every), pause=args.pause
    )
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(f"w={result['w']:.3f} b={result['b']:.3f} after {result['steps']} steps", flush=True)


if __name__ == "__main__":
    main()
