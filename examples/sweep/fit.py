"""One trial of a sweep: fit y = 3x + 2 by gradient descent (plain Python,
no TensorFlow, a second on any node).

`deploy.py sweep` starts it once per point of the grid with the values as
variables (LEARNING_RATE=0.1) and in the command ({learning_rate});
TFCLUSTER_RUN_DIR is the trial's folder, which comes home. It reports its
loss as it goes on tfcluster's progress protocol (the sweep's live table
shows the last one) and writes summary.json (`deploy.py report` ranks the
trials by it).

    deploy.py sweep --param learning_rate=0.3,0.1,0.03,0.01 --param steps=50,200 \
        -- python fit.py --learning-rate {learning_rate} --steps {steps}
"""

import argparse
import json
import os
import random

parser = argparse.ArgumentParser()
parser.add_argument("--learning-rate", type=float, default=0.1)
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

rng = random.Random(int(os.environ.get("TFCLUSTER_TRIAL", "0")))
xs = [rng.uniform(-1, 1) for _ in range(256)]
ys = [3 * x + 2 + rng.gauss(0, 0.1) for x in xs]
w = b = 0.0
loss = float("nan")
for step in range(1, args.steps + 1):
    errors = [w * x + b - y for x, y in zip(xs, ys, strict=True)]
    loss = sum(e * e for e in errors) / len(errors)
    w -= args.learning_rate * 2 * sum(e * x for e, x in zip(errors, xs, strict=True)) / len(xs)
    b -= args.learning_rate * 2 * sum(errors) / len(xs)
    if step % 10 == 0:
        print("@tfcluster " + json.dumps({"event": "metrics", "loss": loss}), flush=True)

run_dir = os.environ.get("TFCLUSTER_RUN_DIR", ".")
with open(os.path.join(run_dir, "summary.json"), "w") as out:
    json.dump({"loss": loss, "w": w, "b": b}, out)
print(f"w={w:.3f} b={b:.3f} loss={loss:.5f}")
