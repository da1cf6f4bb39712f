"""A stand-in for one trial of a sweep, without TensorFlow.

Records what it was started with (its TFCLUSTER_* variables, its
parameters as variables, its argv) and when it started and ended (wall
clock, for the tests that check how many trials ran at once) in
$TFCLUSTER_RUN_DIR/trial.json; prints a metric line on the progress
protocol and writes summary.json with its final "score". TRIAL_SLEEP
seconds of "work" (after the file TRIAL_GATE exists, if set); the trial whose number is FAIL_TRIAL exits with 3.
"""

import json
import os
import sys
import time

started = time.time()
trial = int(os.environ["TFCLUSTER_TRIAL"])
run_dir = os.environ["TFCLUSTER_RUN_DIR"]
lr = float(os.environ.get("LR", "0"))
print(f"trial {trial} starts", flush=True)
print("@tfcluster " + json.dumps({"event": "metrics", "score": lr}), flush=True)
gate = os.environ.get("TRIAL_GATE")
if gate:  # wait for the test to open the gate (a file)
    while not os.path.exists(gate):
        time.sleep(0.05)
time.sleep(float(os.environ.get("TRIAL_SLEEP", "1")))
ended = time.time()
record = {
    "trial": trial,
    "run_dir": run_dir,
    "sweep": os.environ.get("TFCLUSTER_SWEEP"),
    "argv": sys.argv[1:],
    "env": {k: v for k, v in os.environ.items() if k in ("LR", "BATCH", "NAME")},
    "tf_config": os.environ.get("TF_CONFIG"),
    "cwd": os.getcwd(),
    "started": started,
    "ended": ended,
}
with open(os.path.join(run_dir, "trial.json"), "w") as f:
    json.dump(record, f)
if os.environ.get("FAIL_TRIAL") == str(trial):
    print(f"trial {trial} fails on purpose", file=sys.stderr, flush=True)
    sys.exit(3)
with open(os.path.join(run_dir, "summary.json"), "w") as f:
    json.dump({"score": lr * 10}, f)
print("@tfcluster " + json.dumps({"event": "metrics", "score": lr * 10}), flush=True)
