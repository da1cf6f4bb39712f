"""A stand-in for a user's program, without TensorFlow (starts in a blink).

Every task records what it was started with (TF_CONFIG, TFCLUSTER_*, the
working folder, the Python) in $TFCLUSTER_RUN_DIR/<task>.json. A ps or
worker then listens on its TF_CONFIG port, as a tf.distribute.Server would,
until it is stopped; the chief prints a line, waits CHIEF_SLEEP seconds and
exits with CHIEF_CODE. FAIL_TASK=<task> makes that task fail at once;
PRINT_FILE=<file> has every task print that file first; HANG_TASK=<task>
has that task print a line and never listen; DIE_TASK=<task> has it exit
with DIE_CODE a second after it listens. CHIEF_ECHO=<file>: the chief first
prints that file's lines, as they are (a program echoing its input:
tests/test_protocol.py gives it hostile ones).
"""

import json
import os
import socket
import sys
import time

config = json.loads(os.environ["TF_CONFIG"])
kind, index = config["task"]["type"], config["task"]["index"]
task = os.environ["TFCLUSTER_TASK"]
record = {
    "tf_config": config,
    "task": task,
    "run_id": os.environ["TFCLUSTER_RUN_ID"],
    "run_dir": os.environ["TFCLUSTER_RUN_DIR"],
    "cwd": os.getcwd(),
    "python": sys.executable,
    "argv": sys.argv[1:],
    "env": {k: v for k, v in os.environ.items() if k.startswith("USER_")},
    "bucket_url": os.environ.get("TFCLUSTER_BUCKET_URL"),
    "legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS"),
}
with open(os.path.join(os.environ["TFCLUSTER_RUN_DIR"], f"{task}.json"), "w") as f:
    json.dump(record, f)
if os.environ.get("PRINT_FILE"):  # as a program that imports TensorFlow prints its load log
    with open(os.environ["PRINT_FILE"]) as f:
        print(f.read(), end="", flush=True)
print(f"{task} started", flush=True)

if os.environ.get("FAIL_TASK") == task:
    print(f"{task} fails on purpose", file=sys.stderr, flush=True)
    sys.exit(int(os.environ.get("FAIL_CODE", "3")))
if os.environ.get("HANG_TASK") == task:  # busy before it listens, for ever
    print(f"{task} is loading its data", flush=True)
    time.sleep(3600)
if kind != "chief":
    port = int(config["cluster"][kind][index].rsplit(":", 1)[1])
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen()
    if os.environ.get("DIE_TASK") == task:  # dies once the job runs
        time.sleep(1)
        print(f"{task} dies mid-job", file=sys.stderr, flush=True)
        sys.exit(int(os.environ.get("DIE_CODE", "4")))
    time.sleep(3600)
if echo := os.environ.get("CHIEF_ECHO"):
    with open(echo, "rb") as f:
        sys.stdout.buffer.write(f.read())
    sys.stdout.flush()
time.sleep(float(os.environ.get("CHIEF_SLEEP", "0")))
print("chief says goodbye", flush=True)
sys.exit(int(os.environ.get("CHIEF_CODE", "0")))
